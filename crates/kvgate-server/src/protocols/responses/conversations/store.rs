//! Stored conversations (`/v1/conversations`): each a list of items (the Responses API's items, as
//! `/v1/conversations/{id}/items` lists them) and metadata, owned by one API key, in a
//! [`Bounded`] map with the responses store's bounds (`--responses-store-entries`,
//! `--responses-store-memory`). A response with `conversation` reads the items as its history and
//! adds its input and output items when it ends.

use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::ids::{item_id, now_secs};
use crate::pipeline::bounded::Bounded;
use crate::pipeline::conversation::item::InputItem;

/// One conversation.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub id: String,
    pub created_at: u64,
    pub metadata: Map<String, Value>,
    pub items: Vec<InputItem>,
}

fn size(c: &Conversation) -> usize {
    let items: usize = c.items.iter().map(|i| i.to_json().to_string().len()).sum();
    256 + items + c.metadata.values().map(|v| v.to_string().len()).sum::<usize>()
}

/// The store.
pub struct ConversationStore {
    map: Bounded<Conversation>,
}

fn missing(id: &str) -> ApiError {
    ApiError::NotFound(format!(
        "no conversation with id {id:?} (conversations are stored per API key, bounded by --responses-store-entries)"
    ))
}

impl ConversationStore {
    /// A store of at most `max_entries` conversations and `max_bytes` bytes (0 entries: off).
    pub fn new(max_entries: usize, max_bytes: usize) -> ConversationStore {
        ConversationStore {
            map: Bounded::new(max_entries, max_bytes, size),
        }
    }

    /// A new conversation of `items` and `metadata`.
    pub fn create(
        &self,
        tenant: Option<u32>,
        metadata: Map<String, Value>,
        items: Vec<InputItem>,
    ) -> Result<Conversation, ApiError> {
        if !self.map.enabled() {
            return Err(ApiError::param(
                "conversation",
                "conversations are not stored on this server (--responses-store-entries is 0)",
            ));
        }
        let c = Conversation {
            id: item_id("conv"),
            created_at: now_secs(),
            metadata,
            items,
        };
        if !self.map.put(tenant, &c.id, c.clone()) {
            return Err(ApiError::param(
                "items",
                "the conversation is larger than --responses-store-memory",
            ));
        }
        Ok(c)
    }

    /// Conversation `id` of `tenant`.
    pub fn get(&self, tenant: Option<u32>, id: &str) -> Result<Conversation, ApiError> {
        self.map.get(tenant, id).ok_or_else(|| missing(id))
    }

    /// The items of conversation `id`, oldest first.
    pub fn items(&self, tenant: Option<u32>, id: &str) -> Result<Vec<InputItem>, ApiError> {
        self.get(tenant, id).map(|c| c.items)
    }

    /// Adds `items` at the end of conversation `id`.
    pub fn append(&self, tenant: Option<u32>, id: &str, items: Vec<InputItem>) -> Result<(), ApiError> {
        self.map
            .update(tenant, id, |c| c.items.extend(items))
            .ok_or_else(|| missing(id))
    }

    /// Replaces the metadata of conversation `id`.
    pub fn set_metadata(
        &self,
        tenant: Option<u32>,
        id: &str,
        metadata: Map<String, Value>,
    ) -> Result<Conversation, ApiError> {
        self.map
            .update(tenant, id, |c| {
                c.metadata = metadata;
                c.clone()
            })
            .ok_or_else(|| missing(id))
    }

    /// Deletes conversation `id`.
    pub fn delete(&self, tenant: Option<u32>, id: &str) -> Result<(), ApiError> {
        self.map.delete(tenant, id).then_some(()).ok_or_else(|| missing(id))
    }

    /// Deletes item `item` of conversation `id`; the conversation after.
    pub fn delete_item(&self, tenant: Option<u32>, id: &str, item: &str) -> Result<Conversation, ApiError> {
        let removed = self
            .map
            .update(tenant, id, |c| {
                let before = c.items.len();
                c.items.retain(|i| i.id() != Some(item));
                (before != c.items.len()).then(|| c.clone())
            })
            .ok_or_else(|| missing(id))?;
        removed.ok_or_else(|| ApiError::NotFound(format!("conversation {id:?} has no item {item:?}")))
    }
}
