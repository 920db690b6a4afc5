//! The Conversations API on the wire (`/v1/conversations`, as OpenAI defines it): request bodies,
//! the conversation object, item lists and the list query, as serde types.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::pipeline::conversation::item::InputItem;

/// `POST /v1/conversations`.
#[derive(Debug, Default, Deserialize)]
pub struct CreateBody {
    /// Up to 20 items to start with.
    #[serde(default)]
    pub items: Option<Value>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// `POST /v1/conversations/{id}`.
#[derive(Debug, Deserialize)]
pub struct UpdateBody {
    pub metadata: Map<String, Value>,
}

/// `POST /v1/conversations/{id}/items`.
#[derive(Debug, Deserialize)]
pub struct AddItemsBody {
    /// Up to 20 items.
    pub items: Value,
}

/// The list query of `GET /v1/conversations/{id}/items`.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    /// 1 to 100 (default 20).
    pub limit: Option<i64>,
    /// `asc` or `desc` (default).
    pub order: Option<String>,
    /// The item id to list after.
    pub after: Option<String>,
}

/// The conversation object.
#[derive(Debug, Clone, Serialize)]
pub struct ConversationObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    pub metadata: Map<String, Value>,
}

/// A page of items.
#[derive(Debug, Clone, Serialize)]
pub struct ItemList {
    pub object: &'static str,
    pub data: Vec<InputItem>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

/// `DELETE /v1/conversations/{id}`'s body.
#[derive(Debug, Clone, Serialize)]
pub struct Deleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}
