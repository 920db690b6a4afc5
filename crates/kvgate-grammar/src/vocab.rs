//! The tokenizer as llguidance sees it: a [`toktrie::TokTrie`] over the bytes of every token id
//! (special tokens behind toktrie's 0xFF marker), padded to the model's vocabulary, with the model's
//! end-of-sequence ids; text is tokenized by kvgate's own tokenizer.

use std::sync::Arc;

use kvgate_model::Tokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::GrammarError;

/// kvgate's tokenizer behind llguidance's [`TokenizerEnv`].
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie
            .tokenize_with_greedy_fallback(s, |text| self.tok.encode(text, false).unwrap_or_default())
    }
}

/// Builds the environment for `tok` over a model vocabulary of `vocab` ids (≥ the tokenizer's; the
/// rest are unreachable placeholders) ending at any of `eos`.
pub(crate) fn tok_env(tok: Arc<Tokenizer>, eos: &[u32], vocab: usize) -> Result<TokEnv, GrammarError> {
    let mut words: Vec<Vec<u8>> = tok
        .token_bytes()
        .into_iter()
        .map(|(mut b, special)| {
            if special {
                b.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            }
            b
        })
        .collect();
    if words.len() > vocab {
        return Err(GrammarError::Vocabulary(format!(
            "the tokenizer has {} tokens but the model only {vocab}",
            words.len()
        )));
    }
    while words.len() < vocab {
        let mut name = format!(".<[{}]>", words.len()).into_bytes();
        name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
        words.push(name);
    }
    let Some(&first_eos) = eos.first() else {
        return Err(GrammarError::Vocabulary(
            "the model has no end-of-sequence token".into(),
        ));
    };
    let info = TokRxInfo::new(vocab as u32, first_eos);
    let mut trie = TokTrie::from(&info, &words);
    if eos.len() > 1 {
        trie = trie.with_eos_tokens(eos);
    }
    Ok(Arc::new(Env { trie, tok }))
}
