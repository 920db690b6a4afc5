//! The tokenizer: a Hugging Face `tokenizer.json`, or, for a GGUF that ships none, one built from the
//! GGUF's own byte-level BPE vocabulary and merges with the pre-tokenizer its `tokenizer.ggml.pre`
//! names (the same regexes llama.cpp uses), or from its SentencePiece vocabulary ([`crate::spm`]). Special tokens (`<|im_start|>`…) are parsed out of text.
//!
//! Also the incremental detokenizer used for streaming: it only releases text once it is stable (no
//! dangling partial UTF-8 sequence), so concatenated stream deltas equal the full decode.

use std::path::Path;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{ModelError, Result};
use crate::load_gguf::GgufMeta;

/// Llama 3's pre-tokenizer regex.
const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer regex.
const QWEN2_RE: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// A tokenizer with kvgate's conventions (ids are `u32`; special tokens are parsed from text).
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Loads a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer { inner })
    }

    /// Wraps an already built tokenizer.
    pub fn from_inner(inner: tokenizers::Tokenizer) -> Tokenizer {
        Tokenizer { inner }
    }

    /// Builds the tokenizer a GGUF describes: byte-level BPE (`tokenizer.ggml.model = gpt2`) or
    /// SentencePiece (`llama`, see [`crate::spm`]).
    pub fn from_gguf(meta: &GgufMeta) -> Result<Tokenizer> {
        let model = meta.str("tokenizer.ggml.model").unwrap_or("");
        if model != "gpt2" && model != "llama" {
            return Err(ModelError::Unsupported(format!(
                "GGUF tokenizer model '{model}': kvgate builds byte-level BPE ('gpt2') and SentencePiece \
                 ('llama') vocabularies itself; for others put the model's tokenizer.json next to the .gguf file"
            )));
        }
        let tokens = meta
            .strings("tokenizer.ggml.tokens")
            .ok_or_else(|| ModelError::Invalid("GGUF lacks tokenizer.ggml.tokens".into()))?;
        if model == "llama" {
            let types = meta.ints("tokenizer.ggml.token_type").unwrap_or_default();
            return Ok(Tokenizer {
                inner: crate::spm::from_gguf(meta, &tokens, &types)?,
            });
        }
        let merges = meta
            .strings("tokenizer.ggml.merges")
            .ok_or_else(|| ModelError::Invalid("GGUF lacks tokenizer.ggml.merges".into()))?;
        let types = meta.ints("tokenizer.ggml.token_type").unwrap_or_default();
        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let merges: Vec<(String, String)> = merges
            .iter()
            .filter_map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(tok_err)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, true, true);
        let split = |re: &str| -> Result<PreTokenizerWrapper> {
            Ok(
                Split::new(SplitPattern::Regex(re.into()), SplitDelimiterBehavior::Isolated, false)
                    .map_err(tok_err)?
                    .into(),
            )
        };
        let pre: PreTokenizerWrapper = match meta.str("tokenizer.ggml.pre").unwrap_or("default") {
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
                Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
            }
            "llama-bpe" | "llama3" | "falcon3" | "pixtral" => {
                Sequence::new(vec![split(LLAMA3_RE)?, ByteLevel::new(false, true, false).into()]).into()
            }
            "qwen2" | "deepseek-r1-qwen" => {
                Sequence::new(vec![split(QWEN2_RE)?, ByteLevel::new(false, true, false).into()]).into()
            }
            _ => byte_level.into(),
        };
        inner.with_pre_tokenizer(Some(pre));
        inner.with_decoder(Some(ByteLevel::default()));
        // Control (3) and user-defined (4) tokens are matched as whole strings in text.
        let specials: Vec<AddedToken> = types
            .iter()
            .enumerate()
            .filter(|(_, &t)| t == 3)
            .map(|(i, _)| AddedToken::from(tokens[i].clone(), true))
            .collect();
        let user: Vec<AddedToken> = types
            .iter()
            .enumerate()
            .filter(|(_, &t)| t == 4)
            .map(|(i, _)| AddedToken::from(tokens[i].clone(), false))
            .collect();
        inner.add_special_tokens(specials).map_err(tok_err)?;
        inner.add_tokens(user).map_err(tok_err)?;
        Ok(Tokenizer { inner })
    }

    /// The tokenizer of a GGUF file, from its metadata alone.
    pub fn from_gguf_file(path: &Path) -> Result<Tokenizer> {
        Self::from_gguf(&crate::load_gguf::read_meta(path)?)
    }

    /// Token ids of `text`. `add_special` adds the model's BOS etc. as its post-processor says;
    /// special-token strings in `text` are always parsed.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode_fast(text, add_special).map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(tok_err)
    }

    /// The raw vocabulary string of one token.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a raw vocabulary string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The bytes each token id stands for, and whether it is a special (control) token, for grammar
    /// engines that match output bytes: byte-level BPE vocabularies through the GPT-2 byte map,
    /// SentencePiece ones with `▁` as a space and `<0xNN>` byte tokens, others as their UTF-8 text.
    /// Ids the vocabulary lacks get no bytes.
    pub fn token_bytes(&self) -> Vec<(Vec<u8>, bool)> {
        use tokenizers::DecoderWrapper as D;
        fn kind(d: &D, byte_level: &mut bool, fallback: &mut bool) {
            match d {
                D::ByteLevel(_) => *byte_level = true,
                D::ByteFallback(_) => *fallback = true,
                D::Metaspace(_) => *fallback = true,
                D::Sequence(s) => s.get_decoders().iter().for_each(|d| kind(d, byte_level, fallback)),
                _ => {}
            }
        }
        let (mut byte_level, mut fallback) = (false, false);
        if let Some(d) = self.inner.get_decoder() {
            kind(d, &mut byte_level, &mut fallback);
        }
        let unbyte = gpt2_unbyte_map();
        let added = self.inner.get_added_tokens_decoder();
        (0..self.vocab_size() as u32)
            .map(|id| {
                if let Some(a) = added.get(&id) {
                    return (a.content.as_bytes().to_vec(), a.special);
                }
                let Some(t) = self.inner.id_to_token(id) else {
                    return (vec![], false);
                };
                let bytes = if byte_level {
                    t.chars()
                        .map(|c| unbyte.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_else(|| t.as_bytes().to_vec())
                } else if fallback {
                    match t.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                        Some(h) if h.len() == 2 => {
                            u8::from_str_radix(h, 16).map_or_else(|_| t.as_bytes().to_vec(), |b| vec![b])
                        }
                        _ => t.replace('▁', " ").into_bytes(),
                    }
                } else {
                    t.into_bytes()
                };
                (bytes, false)
            })
            .collect()
    }

    /// Whether `id` is a special (added, special) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special)
    }
}

/// The GPT-2 byte-level alphabet, reversed: the printable character each byte is written as → the byte.
fn gpt2_unbyte_map() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                b as char
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or('\u{FFFD}')
            };
            (c, b)
        })
        .collect()
}

/// Turns a growing list of generated ids into text deltas, holding back text that could still change
/// (an incomplete UTF-8 sequence decodes to U+FFFD).
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Starts a decoder. `context` is the prompt's tail (a few ids) so that the first token decodes
    /// with the right leading space handling; it is never emitted.
    pub fn new(context: &[u32]) -> IncrementalDecoder {
        IncrementalDecoder {
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
        }
    }

    /// Adds one id and returns the text that became stable.
    pub fn push(&mut self, tok: &Tokenizer, id: u32, skip_special: bool) -> Result<String> {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip_special)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], skip_special)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Whatever is still held back (at the end of generation).
    pub fn flush(&mut self, tok: &Tokenizer, skip_special: bool) -> Result<String> {
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip_special)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], skip_special)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        if full.len() > prefix.len() && full.is_char_boundary(prefix.len()) {
            Ok(full[prefix.len()..].to_string())
        } else {
            Ok(String::new())
        }
    }
}
