//! OpenAI's Conversations API (`/v1/conversations`): create (with up to 20 items), retrieve, update
//! the metadata, delete; list, add (up to 20 at a time), retrieve and delete items. A conversation is
//! stored per API key in [`store`] with the responses store's bounds; `/v1/responses` with
//! `conversation` reads its items as the history and adds the turn's input and output items when the
//! response ends, and the conversation's state is retained as a session's (keyed by its id unless a
//! `prompt_cache_key` is given) so the next turn finds it warm.

pub mod store;
mod wire;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

use crate::http::error::{ApiError, SpecError};
use crate::http::middleware::RequestTenant;
use crate::pipeline::conversation::item::{self, InputItem, Unknown};
use crate::pipeline::openai::request::strict_body;
use crate::protocols::responses::ResponsesState;

use store::Conversation;
use wire::{AddItemsBody, ConversationObject, CreateBody, Deleted, ItemList, ListQuery, UpdateBody};

/// Items one request may add.
const MAX_ITEMS: usize = 20;

fn object(c: &Conversation) -> ConversationObject {
    ConversationObject {
        id: c.id.clone(),
        object: "conversation",
        created_at: c.created_at,
        metadata: c.metadata.clone(),
    }
}

/// OpenAI's metadata bounds: 16 keys of at most 64 characters, string values of at most 512.
fn check_metadata(m: &Map<String, Value>) -> Result<(), ApiError> {
    if m.len() > 16 {
        return Err(ApiError::param(
            "metadata",
            format!("'metadata' may hold at most 16 keys, got {}", m.len()),
        ));
    }
    for (k, v) in m {
        if k.chars().count() > 64 {
            return Err(ApiError::param(
                "metadata",
                format!("metadata key {k:?} is longer than 64 characters"),
            ));
        }
        match v.as_str() {
            Some(s) if s.chars().count() <= 512 => {}
            Some(_) => {
                return Err(ApiError::param(
                    "metadata",
                    format!("metadata[{k:?}] is longer than 512 characters"),
                ))
            }
            None => return Err(ApiError::param("metadata", format!("metadata[{k:?}] must be a string"))),
        }
    }
    Ok(())
}

/// A body's `items` (at most 20), read as `/v1/responses` reads input items (a bad one is refused
/// here, not on a later turn), as the conversation keeps them ([`InputItem::stored`]).
fn read_items(items: &Value) -> Result<Vec<InputItem>, ApiError> {
    let n = items.as_array().map(Vec::len).unwrap_or(1);
    if n > MAX_ITEMS {
        return Err(ApiError::param(
            "items",
            format!("'items' may hold at most {MAX_ITEMS} items per request, got {n}"),
        ));
    }
    if !items.is_array() {
        return Err(ApiError::param("items", "'items' must be a list of items"));
    }
    let read = item::read_list(items, "items", Unknown::Ignore).map_err(|e| e.in_field("items"))?;
    Ok(read.into_iter().map(InputItem::stored).collect())
}

/// The body as `T`, strictly (an unknown field is a 400 naming it, as on every route).
fn body<T: serde::de::DeserializeOwned>(
    st: &ResponsesState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    strict_body(st.json_body(headers, body)?)
}

/// `POST /v1/conversations`.
pub async fn create(
    State(st): State<Arc<ResponsesState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, SpecError> {
    let b: CreateBody = body(&st, &headers, raw)?;
    let metadata = b.metadata.unwrap_or_default();
    check_metadata(&metadata)?;
    let items = match &b.items {
        None | Some(Value::Null) => vec![],
        Some(v) => read_items(v)?,
    };
    let c = st.conversations().create(tenant, metadata, items)?;
    Ok(Json(object(&c)).into_response())
}

/// `GET /v1/conversations/{id}`.
pub async fn get(
    State(st): State<Arc<ResponsesState>>,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
) -> Result<Response, SpecError> {
    Ok(Json(object(&st.conversations().get(tenant, &id)?)).into_response())
}

/// `POST /v1/conversations/{id}`: replaces the metadata.
pub async fn update(
    State(st): State<Arc<ResponsesState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, SpecError> {
    let b: UpdateBody = body(&st, &headers, raw)?;
    check_metadata(&b.metadata)?;
    let c = st.conversations().set_metadata(tenant, &id, b.metadata)?;
    Ok(Json(object(&c)).into_response())
}

/// `DELETE /v1/conversations/{id}`.
pub async fn delete(
    State(st): State<Arc<ResponsesState>>,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
) -> Result<Response, SpecError> {
    st.conversations().delete(tenant, &id)?;
    Ok(Json(Deleted {
        id,
        object: "conversation.deleted",
        deleted: true,
    })
    .into_response())
}

fn page(data: Vec<InputItem>, has_more: bool) -> ItemList {
    ItemList {
        object: "list",
        first_id: data.first().and_then(InputItem::id).map(str::to_string),
        last_id: data.last().and_then(InputItem::id).map(str::to_string),
        data,
        has_more,
    }
}

/// `GET /v1/conversations/{id}/items`: `limit` (1 to 100, default 20), `order` (`desc` default,
/// or `asc`), `after` (an item id).
pub async fn list_items(
    State(st): State<Arc<ResponsesState>>,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, SpecError> {
    let Query(q) = q.map_err(|e| ApiError::param("query", e.body_text()))?;
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(SpecError::from(ApiError::param(
            "limit",
            format!("'limit' must be between 1 and 100, got {limit}"),
        )));
    }
    let mut items = st.conversations().items(tenant, &id)?;
    match q.order.as_deref().unwrap_or("desc") {
        "desc" => items.reverse(),
        "asc" => {}
        other => {
            return Err(SpecError::from(ApiError::param(
                "order",
                format!("'order' must be \"asc\" or \"desc\", got {other:?}"),
            )))
        }
    }
    if let Some(after) = q.after.as_deref() {
        let at = items
            .iter()
            .position(|i| i.id() == Some(after))
            .ok_or_else(|| ApiError::param("after", format!("conversation {id:?} has no item {after:?}")))?;
        items.drain(..=at);
    }
    let has_more = items.len() > limit as usize;
    items.truncate(limit as usize);
    Ok(Json(page(items, has_more)).into_response())
}

/// `POST /v1/conversations/{id}/items`: the added items.
pub async fn add_items(
    State(st): State<Arc<ResponsesState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, SpecError> {
    let b: AddItemsBody = body(&st, &headers, raw)?;
    let items = read_items(&b.items)?;
    st.conversations().append(tenant, &id, items.clone())?;
    Ok(Json(page(items, false)).into_response())
}

/// `GET /v1/conversations/{id}/items/{item_id}`.
pub async fn get_item(
    State(st): State<Arc<ResponsesState>>,
    RequestTenant(tenant): RequestTenant,
    Path((id, item)): Path<(String, String)>,
) -> Result<Response, SpecError> {
    let items = st.conversations().items(tenant, &id)?;
    let found = items
        .into_iter()
        .find(|i| i.id() == Some(item.as_str()))
        .ok_or_else(|| ApiError::NotFound(format!("conversation {id:?} has no item {item:?}")))?;
    Ok(Json(found).into_response())
}

/// `DELETE /v1/conversations/{id}/items/{item_id}`: the conversation after.
pub async fn delete_item(
    State(st): State<Arc<ResponsesState>>,
    RequestTenant(tenant): RequestTenant,
    Path((id, item)): Path<(String, String)>,
) -> Result<Response, SpecError> {
    let c = st.conversations().delete_item(tenant, &id, &item)?;
    Ok(Json(object(&c)).into_response())
}
