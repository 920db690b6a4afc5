//! `POST /v1/completions`: one prompt (string or token ids) or a list of them, non-streaming or SSE,
//! with `echo`, legacy `logprobs`, `n`, stop strings and usage.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::stream::StreamExt;
use kvgate_engine::{Event, FinishReason, GenerateRequest, TokenLogprob};
use serde_json::Value;

use crate::error::ApiError;
use crate::events::{collect, merged, now_secs, request_id, sse, submit_all};
use crate::openai::request::{endpoint_body, CompletionFields};
use crate::openai::response::{to_json, Completion, CompletionChoice, LegacyLogprobs, StopReason, TopMap, UsageOut};
use crate::sampling::{self, int_in};
use crate::state::{AppState, RequestTenant};

/// A prompt as given: its tokens and its text (for `echo`).
struct Prompt {
    ids: Vec<u32>,
    text: String,
}

/// Tokens an empty text prompt is read as, the first this vocabulary has.
const DOCUMENT_START: [&str; 4] = ["<|endoftext|>", "<|begin_of_text|>", "<s>", "<bos>"];

/// A prompt as sent, before tokenization.
enum RawPrompt<'a> {
    Text(&'a str),
    Ids(&'a [Value]),
}

async fn read_prompts(prompt: Option<&Value>, st: &AppState) -> Result<Vec<Prompt>, ApiError> {
    let tok = &st.tokenizer;
    let raw: Vec<RawPrompt> = match prompt.filter(|v| !v.is_null()) {
        None => return Err(ApiError::param("prompt", "'prompt' is required")),
        Some(Value::String(s)) => vec![RawPrompt::Text(s)],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::param("prompt", "'prompt' must not be empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .iter()
            .map(|s| RawPrompt::Text(s.as_str().unwrap_or_default()))
            .collect(),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![RawPrompt::Ids(a)],
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a
            .iter()
            .map(|x| RawPrompt::Ids(x.as_array().map(Vec::as_slice).unwrap_or_default()))
            .collect(),
        Some(_) => {
            return Err(ApiError::param(
                "prompt",
                "'prompt' must be a string, a list of strings, a list of token ids, or a list of lists of token ids",
            ))
        }
    };
    if raw.len() > 64 {
        return Err(ApiError::param(
            "prompt",
            format!("at most 64 prompts per request, got {}", raw.len()),
        ));
    }
    let vocab = st.engine.limits().vocab_size;
    let mut prompts = Vec::with_capacity(raw.len());
    for r in raw {
        let p = match r {
            RawPrompt::Text(s) => {
                // bounded by bytes, then tokenized off the async runtime
                let mut ids = st.encode("prompt", s.to_string(), true).await?;
                if ids.is_empty() {
                    // `""` (which OpenAI accepts): the model's document-start token, as GPT models read
                    // an empty prompt after `<|endoftext|>`
                    ids.extend(DOCUMENT_START.iter().find_map(|t| tok.token_to_id(t)));
                }
                Prompt {
                    ids,
                    text: s.to_string(),
                }
            }
            RawPrompt::Ids(a) => {
                let ids: Vec<u32> = a
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .filter(|&t| (t as usize) < vocab)
                            .map(|t| t as u32)
                            .ok_or_else(|| {
                                ApiError::param(
                                    "prompt",
                                    format!("'prompt' contains token id {x}, outside the vocabulary (size {vocab})"),
                                )
                            })
                    })
                    .collect::<Result<_, _>>()?;
                let text = tok.decode(&ids, false).unwrap_or_default();
                Prompt { ids, text }
            }
        };
        if p.ids.is_empty() {
            return Err(ApiError::param("prompt", "'prompt' must contain at least one token"));
        }
        prompts.push(p);
    }
    Ok(prompts)
}

/// Legacy completions logprobs for a run of tokens, `text_offset` starting at `offset`.
fn legacy_logprobs(st: &AppState, lps: &[Option<TokenLogprob>], tokens: &[u32], offset: usize) -> LegacyLogprobs {
    let mut out = LegacyLogprobs {
        tokens: vec![],
        token_logprobs: vec![],
        top_logprobs: vec![],
        text_offset: vec![],
    };
    let mut off = offset;
    for (i, &t) in tokens.iter().enumerate() {
        let s = st.tokenizer.decode(&[t], false).unwrap_or_default();
        out.text_offset.push(off);
        off += s.len();
        out.tokens.push(s);
        let l = lps.get(i).and_then(|x| x.as_ref());
        out.token_logprobs.push(l.map(|l| l.logprob));
        out.top_logprobs.push(l.filter(|l| !l.top.is_empty()).map(|l| {
            let mut m = TopMap::default();
            for &(id, lp) in &l.top {
                m.insert(st.tokenizer.decode(&[id], false).unwrap_or_default(), lp);
            }
            m
        }));
    }
    out
}

/// The handler.
pub async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    let (sf, so, cf, value) = endpoint_body::<CompletionFields>(map)?;
    let model = st.check_model(sf.model.as_deref())?;
    let echo = cf.echo.unwrap_or(false);
    let max_tokens = int_in("max_tokens", sf.max_tokens, 0, i64::MAX)?.unwrap_or(16);
    // `max_tokens: 0` with `echo` scores the prompt only (lm-eval's loglikelihood): the engine samples
    // one token from the last position's logits (no further forward pass), which is left out of the
    // answer and of `usage`
    let score_only = max_tokens == 0;
    if score_only && !echo {
        return Err(ApiError::param(
            "max_tokens",
            "'max_tokens' must be at least 1 unless 'echo' is true (0 with echo scores the prompt only), got 0",
        ));
    }
    if score_only && sf.stream.unwrap_or(false) {
        return Err(ApiError::param(
            "max_tokens",
            "'max_tokens' 0 (score the prompt only) is not supported with 'stream'",
        ));
    }
    let mut c = sampling::read(
        &sf,
        &st.defaults,
        st.engine.limits().vocab_size,
        Some(max_tokens.max(1)),
    )?;
    if score_only && c.params.min_tokens > 0 {
        return Err(ApiError::param(
            "min_tokens",
            format!(
                "'min_tokens' ({}) must not exceed 'max_tokens' (0)",
                c.params.min_tokens
            ),
        ));
    }
    let logprobs = int_in("logprobs", cf.logprobs, 0, 20)?.map(|x| x as usize);
    c.params.logprobs = logprobs;
    if echo && logprobs.is_some() {
        c.params.prompt_logprobs = logprobs;
    }
    let prompts = read_prompts(cf.prompt.as_ref(), &st).await?;
    if let Some((field, spec)) = crate::structured::read(&so)? {
        if score_only {
            return Err(ApiError::param(
                field,
                format!("'{field}' has nothing to constrain with 'max_tokens' 0"),
            ));
        }
        c.params.guide = Some(crate::structured::compile(st.grammars.clone(), field, spec).await?);
    }
    if st.args.log_requests {
        tracing::info!(body = %value, "completion request");
    }
    c.cache_salt = st.salted(tenant, c.cache_salt.take());
    let n = c.params.n;
    let reqs = prompts
        .iter()
        .map(|p| GenerateRequest {
            prompt: p.ids.clone(),
            params: c.params.clone(),
            cache_salt: c.cache_salt.clone(),
        })
        .collect();
    let tagged = submit_all(&st, reqs)?;
    let id = request_id("cmpl");
    let created = now_secs();
    if !c.stream {
        let (mut choices, prompt_lps, mut usage) = collect(tagged, n).await?;
        if score_only {
            for ch in &mut choices {
                ch.text.clear();
                ch.tokens.clear();
                ch.logprobs.clear();
                ch.stop = None;
                ch.finish = Some(FinishReason::Length);
            }
            usage.completion_tokens = 0;
        }
        let choices = choices
            .iter()
            .enumerate()
            .map(|(i, ch)| {
                let p = &prompts[i / n];
                let mut text = String::new();
                if echo {
                    text.push_str(&p.text);
                }
                text.push_str(&ch.text);
                let lp = logprobs.map(|_| {
                    let gen: Vec<Option<TokenLogprob>> = ch.logprobs.iter().cloned().map(Some).collect();
                    if echo {
                        let mut all = prompt_lps[i / n].clone().unwrap_or_else(|| vec![None; p.ids.len()]);
                        all.extend(gen);
                        let mut toks = p.ids.clone();
                        toks.extend(&ch.tokens);
                        legacy_logprobs(&st, &all, &toks, 0)
                    } else {
                        legacy_logprobs(&st, &gen, &ch.tokens, 0)
                    }
                });
                CompletionChoice {
                    index: i,
                    text,
                    logprobs: lp,
                    finish_reason: ch.finish.map(FinishReason::as_str),
                    stop_reason: StopReason::of(&ch.stop),
                }
            })
            .collect();
        let out = Completion {
            id,
            object: "text_completion",
            created,
            model,
            choices,
            usage: Some(UsageOut::of(&usage)),
        };
        return Ok(axum::Json(out).into_response());
    }
    // Streaming.
    let prompts_text: Vec<String> = prompts.iter().map(|p| p.text.clone()).collect();
    let prompt_ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let mut prompt_lps: Vec<Option<Vec<Option<TokenLogprob>>>> = vec![None; prompts.len()];
    let total_prompts = prompts_text.len();
    let mut echoed = vec![false; total_prompts * n];
    let mut offsets = vec![0usize; total_prompts * n];
    let mut usage = kvgate_engine::Usage::default();
    let mut done = 0;
    let include_usage = c.include_usage;
    let continuous = c.continuous_usage;
    let prompt_len: usize = prompts.iter().map(|p| p.ids.len()).sum();
    let mut emitted = 0usize;
    let stream = merged(tagged).map(move |(pi, ev)| {
        let chunk = |choices: Vec<CompletionChoice>, usage: Option<UsageOut>| Completion {
            id: id.clone(),
            object: "text_completion",
            created,
            model: model.clone(),
            choices,
            usage,
        };
        let choice = |index: usize, text: String, logprobs: Option<LegacyLogprobs>| CompletionChoice {
            index,
            text,
            logprobs,
            finish_reason: None,
            stop_reason: None,
        };
        let mut out: Vec<Completion> = vec![];
        match ev {
            Event::Token {
                choice: c,
                token,
                text,
                logprob,
            } => {
                emitted += 1;
                let idx = pi * n + c;
                let mut t = String::new();
                let first_echo = echo && !echoed[idx];
                if first_echo {
                    echoed[idx] = true;
                    t.push_str(&prompts_text[pi]);
                }
                t.push_str(&text);
                let lp = match (logprobs, logprob) {
                    // the echoed prompt's logprobs come with its text, offsets counting from its start
                    (Some(_), Some(l)) if first_echo => {
                        let mut all = prompt_lps[pi]
                            .clone()
                            .unwrap_or_else(|| vec![None; prompt_ids[pi].len()]);
                        all.push(Some(l));
                        let mut toks = prompt_ids[pi].clone();
                        toks.push(token);
                        let v = Some(legacy_logprobs(&st, &all, &toks, 0));
                        offsets[idx] = toks
                            .iter()
                            .map(|&t| st.tokenizer.decode(&[t], false).map(|s| s.len()).unwrap_or(0))
                            .sum();
                        v
                    }
                    (Some(_), Some(l)) => {
                        let v = Some(legacy_logprobs(&st, &[Some(l)], &[token], offsets[idx]));
                        offsets[idx] += st.tokenizer.decode(&[token], false).map(|s| s.len()).unwrap_or(0);
                        v
                    }
                    _ => None,
                };
                out.push(chunk(vec![choice(idx, t, lp)], None));
            }
            Event::Finished {
                choice: c,
                reason,
                text,
                stop,
            } => {
                let mut ch = choice(pi * n + c, text, None);
                ch.finish_reason = Some(reason.as_str());
                ch.stop_reason = StopReason::of(&stop);
                out.push(chunk(vec![ch], None));
            }
            Event::Done(u) => {
                usage.prompt_tokens += u.prompt_tokens;
                usage.completion_tokens += u.completion_tokens;
                usage.cached_tokens += u.cached_tokens;
                done += 1;
                if done == total_prompts && include_usage {
                    out.push(chunk(vec![], Some(UsageOut::of(&usage))));
                }
            }
            Event::Error(e) => return vec![ApiError::from(e).body().to_string()],
            Event::PromptLogprobs(l) => prompt_lps[pi] = Some(l),
        }
        if continuous {
            for c in out.iter_mut().filter(|c| c.usage.is_none()) {
                c.usage = Some(UsageOut::running(prompt_len, emitted));
            }
        }
        out.iter().map(to_json).collect()
    });
    Ok(sse(stream))
}
