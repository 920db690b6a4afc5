//! The tiny test model's tokenizer and template (the model itself, random weights from a seed, is
//! `kvgate_cpu::tiny`): byte-level BPE with the 256 byte tokens, a handful of merges (so that decision
//! labels such as `yes`, `no`, ` A` are single tokens, as on real models) and ChatML special tokens; the
//! chat template is ChatML.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use crate::tokenizer::Tokenizer;

/// ChatML, as SmolLM2 and Qwen use it.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Words merged into single tokens (with and without a leading space, as `Ġ`).
const WORDS: [&str; 8] = ["yes", "no", "Yes", "No", "the", "is", "and", "to"];

fn byte_chars() -> Vec<char> {
    // GPT-2's byte → unicode table.
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec!['\0'; 256];
    for (b, c) in bs.iter().zip(cs) {
        table[*b as usize] = char::from_u32(c).unwrap_or('?');
    }
    table
}

/// The tiny byte-level BPE tokenizer (ids 0..3 are `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`).
pub fn tiny_tokenizer() -> Tokenizer {
    let bytes = byte_chars();
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into(), "<|im_end|>".into()];
    tokens.extend(bytes.iter().map(|c| c.to_string()));
    let mut merges: Vec<(String, String)> = vec![];
    let space = bytes[b' ' as usize];
    for w in WORDS {
        let mut cur = String::new();
        for ch in w.chars() {
            if cur.is_empty() {
                cur.push(ch);
                continue;
            }
            let next = format!("{cur}{ch}");
            if !tokens.contains(&next) {
                merges.push((cur.clone(), ch.to_string()));
                tokens.push(next.clone());
            }
            cur = next;
        }
        // The spaced form merges the space onto the whole word.
        merges.push((space.to_string(), w.to_string()));
        tokens.push(format!("{space}{w}"));
    }
    for c in 'A'..='Z' {
        merges.push((space.to_string(), c.to_string()));
        tokens.push(format!("{space}{c}"));
    }
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .expect("tiny BPE");
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    inner.with_decoder(Some(ByteLevel::default()));
    inner
        .add_special_tokens([
            AddedToken::from("<|endoftext|>", true),
            AddedToken::from("<|im_start|>", true),
            AddedToken::from("<|im_end|>", true),
        ])
        .expect("tiny special tokens");
    Tokenizer::from_inner(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_single_tokens() {
        let t = tiny_tokenizer();
        for w in ["yes", " yes", "No", " no", "A", " A", "7"] {
            assert_eq!(t.encode(w, false).unwrap().len(), 1, "{w:?}");
        }
        assert_eq!(t.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap()[0], 1);
        let ids = t.encode("héllo wörld 🚀", false).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), "héllo wörld 🚀");
    }
}
