//! SentencePiece vocabularies from GGUF (`tokenizer.ggml.model = "llama"`: Gemma, Llama 2, Mistral,
//! TinyLlama, Phi-3…), built as the `tokenizers` crate's BPE the way Hugging Face converts these
//! models (`convert_slow_tokenizer`): merges derived from the vocabulary, each piece's splits into two
//! vocabulary pieces ranked by the merged piece's score (llama.cpp's SPM tokenizer merges the bigram
//! of highest score first); unknown characters fall back to the `<0xXX>` byte tokens; spaces become
//! `▁`, with a leading `▁` when the GGUF says `add_space_prefix`; BOS/EOS added as `add_bos_token` /
//! `add_eos_token` say. Control and user-defined tokens are matched whole in text.
//!
//! Checked against llama.cpp's own `/tokenize` on a fixed set of strings (tests/fixtures).

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper};

use crate::error::{ModelError, Result};
use crate::load_gguf::GgufMeta;

/// GGUF token types.
const NORMAL: i64 = 1;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// The merges of a SentencePiece BPE vocabulary: for every normal piece, each split into two pieces
/// of the vocabulary, ordered by the merged piece's score (highest first; ties by the ids of the
/// parts, then the piece's id).
fn merges(tokens: &[String], scores: &[f32], types: &[i64], vocab: &HashMap<String, u32>) -> Vec<(String, String)> {
    let mut pieces: Vec<usize> = (0..tokens.len())
        .filter(|&i| types.get(i).copied().unwrap_or(NORMAL) == NORMAL)
        .collect();
    pieces.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut out = Vec::new();
    for i in pieces {
        let piece = &tokens[i];
        let mut local: Vec<(u32, u32, usize)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                Some((*vocab.get(l)?, *vocab.get(r)?, at))
            })
            .collect();
        local.sort();
        out.extend(local.into_iter().map(|(_, _, at)| {
            let (l, r) = piece.split_at(at);
            (l.to_string(), r.to_string())
        }));
    }
    out
}

/// Builds the tokenizer of a GGUF whose `tokenizer.ggml.model` is `llama`.
pub(crate) fn from_gguf(meta: &GgufMeta, tokens: &[String], types: &[i64]) -> Result<tokenizers::Tokenizer> {
    let scores = meta
        .floats("tokenizer.ggml.scores")
        .ok_or_else(|| ModelError::Invalid("GGUF SentencePiece vocabulary lacks tokenizer.ggml.scores".into()))?;
    if scores.len() != tokens.len() {
        return Err(ModelError::Invalid(format!(
            "GGUF has {} tokens but {} scores",
            tokens.len(),
            scores.len()
        )));
    }
    let vocab: HashMap<String, u32> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = merges(tokens, &scores, types, &vocab);
    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    let unk = meta
        .u32("tokenizer.ggml.unknown_token_id")
        .and_then(|id| tokens.get(id as usize));
    if let Some(unk) = unk {
        bpe = bpe.unk_token(unk.clone());
    }
    let mut inner = tokenizers::Tokenizer::new(bpe.build().map_err(tok_err)?);
    let prefix = meta.bool("tokenizer.ggml.add_space_prefix").unwrap_or(true);
    let mut norm: Vec<NormalizerWrapper> = Vec::new();
    if prefix {
        norm.push(Prepend::new("▁".into()).into());
    }
    norm.push(Replace::new(" ", "▁").map_err(tok_err)?.into());
    inner
        .with_normalizer(Some(NormalizerSequence::new(norm)))
        .map_err(tok_err)?;
    let mut dec: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ").map_err(tok_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if prefix {
        dec.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(dec)));
    // BOS / EOS as the GGUF asks (llama.cpp's `add_special`).
    let special = |key: &str, flag: &str, default: bool| -> Option<(String, u32)> {
        let id = meta.u32(key)?;
        (meta.bool(flag).unwrap_or(default)).then(|| tokens.get(id as usize).map(|t| (t.clone(), id)))?
    };
    let bos = special("tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", true);
    let eos = special("tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_eos_token", false);
    let mut single = Vec::new();
    let mut specials = Vec::new();
    if let Some((t, id)) = bos {
        single.push(t.clone());
        specials.push((t, id));
    }
    single.push("$A".to_string());
    if let Some((t, id)) = eos {
        single.push(t.clone());
        specials.push((t, id));
    }
    let post = TemplateProcessing::builder()
        .try_single(single.join(" "))
        .map_err(tok_err)?
        .special_tokens(specials)
        .build()
        .map_err(tok_err)?;
    inner.with_post_processor(Some(post));
    let added = |ty: i64, special: bool| -> Vec<AddedToken> {
        types
            .iter()
            .enumerate()
            .filter(|(_, &t)| t == ty)
            .map(|(i, _)| AddedToken::from(tokens[i].clone(), special))
            .collect()
    };
    inner.add_special_tokens(added(CONTROL, true)).map_err(tok_err)?;
    inner.add_tokens(added(USER_DEFINED, false)).map_err(tok_err)?;
    Ok(inner)
}
