//! The KV-event publisher (`--kv-events-config`, vLLM's flag and JSON): the engine's batches
//! ([`kvgate_engine::KvEventBatch`]) sent on a ZeroMQ PUB socket in vLLM's wire format, with a ROUTER
//! socket that replays the recent ones to a consumer that missed some.
//!
//! Wire format (what vllm-router 0.1.17, llm-d's indexer and Dynamo decode): three frames — the topic,
//! the sequence number as 8 bytes big-endian, and a msgpack payload `[ts, [event, …], 0]` (timestamp,
//! events, data-parallel rank); each event a map tagged by `"type"`: `BlockStored{block_hashes,
//! parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys}` (consecutive
//! blocks of one chain in one event, as vLLM groups a request's new blocks), `BlockRemoved{block_hashes,
//! medium}`, `AllBlocksCleared{}`. `medium` is `"GPU"`: vLLM's name for the engine's primary cache,
//! whatever the device (consumers give it full credit, and a CPU-only kvgate has no other hot tier).
//! The first batch a replica publishes holds `AllBlocksCleared`.
//!
//! Replay: a consumer sends the first sequence number it wants (8 bytes big-endian) on the replay
//! socket (REQ or DEALER: `[identity, "", seq]` at the ROUTER); every buffered batch from there comes
//! back as `[identity, "", seq, payload]`, then `[identity, "", -1, ""]`. The buffer holds the last
//! `buffer_steps` batches.
//!
//! The publisher is a task on the server's runtime; the engine thread only `try_send`s into its
//! bounded queue (`max_queue_size` batches), so a slow or absent consumer never slows the engine.

use std::collections::VecDeque;

use bytes::Bytes;
use kvgate_engine::{KvEvent, KvEventBatch, KvEventSink};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tracing::{info, warn};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// `--kv-events-config`: vLLM's `KVEventsConfig` keys.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    /// Publish at all (vLLM's default: false).
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// `"zmq"` or `"null"` (nothing published).
    #[serde(default = "default_publisher")]
    pub publisher: String,
    /// The PUB socket: bound when the host is `*` (or the scheme `ipc`), connected otherwise.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// The ROUTER socket for replays (bound), if any.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// vLLM's PUB high-water mark (accepted; the socket's own queue bounds what a slow subscriber holds).
    #[serde(default = "default_hwm")]
    pub hwm: usize,
    /// Batches the engine may queue ahead of the publisher before it drops one (counted, a gap).
    #[serde(default = "default_max_queue")]
    pub max_queue_size: usize,
    /// The first frame of every message.
    #[serde(default)]
    pub topic: String,
}

fn default_publisher() -> String {
    "zmq".into()
}
fn default_endpoint() -> String {
    "tcp://*:5557".into()
}
fn default_buffer_steps() -> usize {
    10_000
}
fn default_hwm() -> usize {
    100_000
}
fn default_max_queue() -> usize {
    100_000
}

impl KvEventsConfig {
    /// Parses the flag's JSON (clap's value parser): unknown keys and bad values are named.
    pub fn parse(s: &str) -> Result<KvEventsConfig, String> {
        let c: KvEventsConfig = serde_json::from_str(s).map_err(|e| format!("not a KV events config: {e}"))?;
        if !matches!(c.publisher.as_str(), "zmq" | "null") {
            return Err(format!("publisher must be \"zmq\" or \"null\", got {:?}", c.publisher));
        }
        for ep in std::iter::once(&c.endpoint).chain(c.replay_endpoint.as_ref()) {
            if !ep.starts_with("tcp://") || !ep[6..].contains(':') {
                return Err(format!(
                    "endpoint {ep:?} must be tcp://HOST:PORT (HOST `*` to bind every interface)"
                ));
            }
        }
        if c.buffer_steps == 0 || c.max_queue_size == 0 {
            return Err("buffer_steps and max_queue_size must be at least 1".into());
        }
        Ok(c)
    }

    /// Whether events are published.
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher == "zmq"
    }
}

/// `tcp://*:P` as the address to bind (`tcp://0.0.0.0:P`), and whether to bind.
fn bind_target(endpoint: &str) -> (String, bool) {
    match endpoint.strip_prefix("tcp://*:") {
        Some(port) => (format!("tcp://0.0.0.0:{port}"), true),
        None => (endpoint.to_string(), endpoint.contains("://0.0.0.0:")),
    }
}

/// One event on the wire (maps tagged by `type`, vLLM's field names).
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
enum Wire<'a> {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: usize,
        lora_id: Option<u32>,
        medium: &'a str,
        lora_name: Option<&'a str>,
        extra_keys: Option<Vec<()>>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: &'a str,
    },
    AllBlocksCleared {},
}

/// The events of a batch on the wire: runs of stores that chain (each the previous one's child) and
/// runs of removals grouped, in order.
fn wire_events(events: &[KvEvent], block_size: usize) -> Vec<Wire<'static>> {
    let mut out: Vec<Wire> = Vec::new();
    for e in events {
        match (e, out.last_mut()) {
            (
                KvEvent::Stored { hash, parent, tokens },
                Some(Wire::BlockStored {
                    block_hashes,
                    token_ids,
                    medium: "GPU",
                    ..
                }),
            ) if parent.is_some() && block_hashes.last() == parent.as_ref() => {
                block_hashes.push(*hash);
                token_ids.extend_from_slice(tokens);
            }
            (KvEvent::Stored { hash, parent, tokens }, _) => out.push(Wire::BlockStored {
                block_hashes: vec![*hash],
                parent_block_hash: *parent,
                token_ids: tokens.to_vec(),
                block_size,
                lora_id: None,
                medium: "GPU",
                lora_name: None,
                extra_keys: None,
            }),
            (
                KvEvent::Removed { hash },
                Some(Wire::BlockRemoved {
                    block_hashes,
                    medium: "GPU",
                }),
            ) => block_hashes.push(*hash),
            (KvEvent::Removed { hash }, _) => out.push(Wire::BlockRemoved {
                block_hashes: vec![*hash],
                medium: "GPU",
            }),
            // what this replica's tiers keep: host memory is vLLM's `CPU`, the spill file `DISK`
            (
                KvEvent::TierStored {
                    hash,
                    parent,
                    tokens,
                    medium,
                },
                _,
            ) => out.push(Wire::BlockStored {
                block_hashes: vec![*hash],
                parent_block_hash: *parent,
                token_ids: tokens.to_vec(),
                block_size,
                lora_id: None,
                medium: medium_name(*medium),
                lora_name: None,
                extra_keys: None,
            }),
            (KvEvent::TierRemoved { hash, medium }, _) => out.push(Wire::BlockRemoved {
                block_hashes: vec![*hash],
                medium: medium_name(*medium),
            }),
            (KvEvent::AllCleared, _) => out.push(Wire::AllBlocksCleared {}),
        }
    }
    out
}

/// vLLM's name of a tier's medium.
fn medium_name(m: kvgate_engine::tier::Medium) -> &'static str {
    match m {
        kvgate_engine::tier::Medium::Memory => "CPU",
        kvgate_engine::tier::Medium::Disk => "DISK",
    }
}

/// A batch's msgpack payload: `[ts, [events], 0]`.
pub fn encode(batch: &KvEventBatch, block_size: usize) -> Vec<u8> {
    let events = wire_events(&batch.events, block_size);
    // maps for the events (named fields), an array for the batch (a tuple)
    rmp_serde::to_vec_named(&(batch.ts, events, 0u32)).unwrap_or_default()
}

/// The end-of-replay marker's sequence frame.
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Binds (or connects) the sockets and starts the publisher task; the engine's sink is returned.
pub async fn start(cfg: &KvEventsConfig, block_size: usize) -> Result<KvEventSink, String> {
    let (sink, rx) = KvEventSink::channel(cfg.max_queue_size);
    let mut pub_socket = PubSocket::new();
    let (target, bind) = bind_target(&cfg.endpoint);
    if bind {
        pub_socket.bind(&target).await
    } else {
        pub_socket
            .connect(&target)
            .await
            .map(|_| target.parse().expect("checked endpoint"))
    }
    .map_err(|e| format!("endpoint {}: {e}", cfg.endpoint))?;
    let replay = match &cfg.replay_endpoint {
        Some(ep) => {
            let mut r = RouterSocket::new();
            r.bind(&bind_target(ep).0)
                .await
                .map_err(|e| format!("replay_endpoint {ep}: {e}"))?;
            Some(r)
        }
        None => None,
    };
    info!(endpoint = %cfg.endpoint, replay = ?cfg.replay_endpoint, "publishing KV events");
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    tokio::spawn(publish(rx, pub_socket, replay, topic, cfg.buffer_steps, block_size));
    Ok(sink)
}

async fn publish(
    mut rx: mpsc::Receiver<KvEventBatch>,
    mut pub_socket: PubSocket,
    mut replay: Option<RouterSocket>,
    topic: Bytes,
    buffer_steps: usize,
    block_size: usize,
) {
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::with_capacity(buffer_steps.min(4096));
    loop {
        let request = async {
            match replay.as_mut() {
                Some(r) => r.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            batch = rx.recv() => {
                let Some(batch) = batch else { return };
                let payload = Bytes::from(encode(&batch, block_size));
                let seq = Bytes::copy_from_slice(&batch.seq.to_be_bytes());
                let msg = ZmqMessage::try_from(vec![topic.clone(), seq, payload.clone()]).expect("three frames");
                if let Err(e) = pub_socket.send(msg).await {
                    warn!(error = %e, seq = batch.seq, "KV event batch not sent");
                }
                metrics::counter!(kvgate_engine::metrics::KV_EVENTS_PUBLISHED).increment(1);
                if buffer.len() == buffer_steps {
                    buffer.pop_front();
                }
                buffer.push_back((batch.seq, payload));
            }
            req = request => {
                let Ok(req) = req else { continue };
                let frames = req.into_vec();
                let (Some(id), Some(start)) = (frames.first(), frames.last()) else { continue };
                let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
                    warn!(frames = frames.len(), "KV event replay request is not an 8-byte sequence number");
                    continue;
                };
                let start = u64::from_be_bytes(start);
                let r = replay.as_mut().expect("a request came from it");
                for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
                    let frames = vec![id.clone(), Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()];
                    if r.send(ZmqMessage::try_from(frames).expect("four frames")).await.is_err() {
                        break;
                    }
                }
                let end = vec![id.clone(), Bytes::new(), Bytes::copy_from_slice(&END_SEQ), Bytes::new()];
                let _ = r.send(ZmqMessage::try_from(end).expect("four frames")).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_vllms_json_and_bad_values_are_named() {
        let c = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
                "replay_endpoint": "tcp://*:5558", "buffer_steps": 100, "topic": ""}"#,
        )
        .unwrap();
        assert!(c.publishes());
        assert_eq!(c.max_queue_size, 100_000);
        assert_eq!(bind_target(&c.endpoint), ("tcp://0.0.0.0:5557".into(), true));
        assert_eq!(bind_target("tcp://127.0.0.1:9"), ("tcp://127.0.0.1:9".into(), false));
        assert!(
            !KvEventsConfig::parse("{}").unwrap().publishes(),
            "off unless enabled, as in vLLM"
        );
        for (bad, named) in [
            (r#"{"publisher": "kafka"}"#, "kafka"),
            (r#"{"endpoint": "ipc:///tmp/x"}"#, "ipc:///tmp/x"),
            (r#"{"frobnicate": 1}"#, "frobnicate"),
            (r#"{"buffer_steps": 0}"#, "buffer_steps"),
        ] {
            let e = KvEventsConfig::parse(bad).unwrap_err();
            assert!(e.contains(named), "{bad}: {e}");
        }
    }

    /// What the tiers keep is published with vLLM's medium names and never merged into the cache's
    /// own stores or removals.
    #[test]
    fn tier_events_name_their_medium() {
        use kvgate_engine::tier::Medium;
        let batch = KvEventBatch {
            seq: 1,
            ts: 0.5,
            events: vec![
                KvEvent::Removed { hash: 4 },
                KvEvent::TierStored {
                    hash: 4,
                    parent: Some(3),
                    tokens: vec![7, 8].into(),
                    medium: Medium::Memory,
                },
                KvEvent::Stored {
                    hash: 5,
                    parent: Some(4),
                    tokens: vec![9, 9].into(),
                },
                KvEvent::TierRemoved {
                    hash: 4,
                    medium: Medium::Memory,
                },
                KvEvent::TierStored {
                    hash: 4,
                    parent: Some(3),
                    tokens: vec![7, 8].into(),
                    medium: Medium::Disk,
                },
                KvEvent::Removed { hash: 5 },
            ],
        };
        let v: serde_json::Value = rmp_serde::from_slice(&encode(&batch, 2)).unwrap();
        let ev = v[1].as_array().unwrap();
        let summary: Vec<(String, String, serde_json::Value)> = ev
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap().to_string(),
                    e["medium"].as_str().unwrap().to_string(),
                    e["block_hashes"].clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("BlockRemoved".into(), "GPU".into(), serde_json::json!([4])),
                ("BlockStored".into(), "CPU".into(), serde_json::json!([4])),
                ("BlockStored".into(), "GPU".into(), serde_json::json!([5])),
                ("BlockRemoved".into(), "CPU".into(), serde_json::json!([4])),
                ("BlockStored".into(), "DISK".into(), serde_json::json!([4])),
                ("BlockRemoved".into(), "GPU".into(), serde_json::json!([5])),
            ]
        );
        assert_eq!(ev[1]["parent_block_hash"], 3);
        assert_eq!(ev[1]["token_ids"], serde_json::json!([7, 8]));
    }

    #[test]
    fn chains_group_into_one_store_and_the_batch_is_an_array_of_tagged_maps() {
        let stored = |hash, parent| KvEvent::Stored {
            hash,
            parent,
            tokens: vec![hash as u32; 2].into(),
        };
        let batch = KvEventBatch {
            seq: 7,
            ts: 1.5,
            events: vec![
                KvEvent::AllCleared,
                stored(1, None),
                stored(2, Some(1)),
                stored(3, Some(1)),
                KvEvent::Removed { hash: 9 },
                KvEvent::Removed { hash: 8 },
            ],
        };
        let v: serde_json::Value = rmp_serde::from_slice(&encode(&batch, 2)).unwrap();
        assert_eq!(v[0], 1.5);
        assert_eq!(v[2], 0);
        let ev = v[1].as_array().unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0], serde_json::json!({"type": "AllBlocksCleared"}));
        assert_eq!(ev[1]["type"], "BlockStored");
        assert_eq!(ev[1]["block_hashes"], serde_json::json!([1, 2]));
        assert_eq!(ev[1]["parent_block_hash"], serde_json::Value::Null);
        assert_eq!(ev[1]["token_ids"], serde_json::json!([1, 1, 2, 2]));
        assert_eq!(ev[1]["block_size"], 2);
        assert_eq!(ev[1]["medium"], "GPU");
        assert_eq!(
            ev[2]["block_hashes"],
            serde_json::json!([3]),
            "a sibling starts a new store"
        );
        assert_eq!(ev[2]["parent_block_hash"], 1);
        assert_eq!(
            ev[3],
            serde_json::json!({"type": "BlockRemoved", "block_hashes": [9, 8], "medium": "GPU"})
        );
    }
}
