//! A `set` read: a question's options as parallel branches of one read (set-based prompting, on the
//! engine's tree attention). The read's text is rendered as any read's, with each option line replaced
//! by a marker ([`crate::render::set_text`]); the text before the first line (the state and the
//! question) and after the last (the closing line and the generation prompt) are tokenized as they
//! are, each option line on its own. In the prompt the lines follow each other in label order — the
//! canonical order, whatever order the request listed them in — and the [`ReadTree`] says: every line
//! starts at the same RoPE position, sees the state and the question and itself, not the other lines;
//! the closing text sees everything. So no option comes first or last: the read does not depend on
//! the order of the options by construction, and two listings of the same options read the very same
//! rows.

use kvgate_engine::{ReadTree, TreeRow};

/// The most tree tokens a `set` read lays out (option lines and the closing text): each carries a
/// bitmask of the tree tokens before it, so a tree's masks grow with the square of its size (2,048
/// tokens: 512 KiB). Longer options are read as one canonical listing instead.
pub const MAX_TREE_TOKENS: usize = 2048;

use crate::error::DecideError;
use crate::render::marker;

/// `bits` with bits `lo..=hi` set (a tree row's `seen`, `hi + 1` bits long).
fn span_bits(lo: usize, hi: usize) -> Vec<u64> {
    let mut v = vec![0u64; (hi + 1).div_ceil(64)];
    for i in lo..=hi {
        v[i / 64] |= 1 << (i % 64);
    }
    v
}

/// The tree of a prompt whose tokens from `start` on are branches of these lengths, in order, then
/// `tail` tokens that see them all.
pub fn tree(start: usize, branches: &[usize], tail: usize) -> ReadTree {
    let longest = branches.iter().copied().max().unwrap_or(0);
    let mut rows = Vec::with_capacity(branches.iter().sum::<usize>() + tail);
    let mut at = 0;
    for &len in branches {
        for j in 0..len {
            rows.push(TreeRow {
                offset: j as u32,
                seen: span_bits(at, at + j),
            });
        }
        at += len;
    }
    for t in 0..tail {
        rows.push(TreeRow {
            offset: (longest + t) as u32,
            seen: span_bits(0, at + t),
        });
    }
    ReadTree { start, rows }
}

/// The prompt and tree of a `set` read from its text rendered with markers and its option lines:
/// `None` when the template did not keep the markers as they were (the caller reads otherwise).
pub fn prompt(
    text: &str,
    lines: &[String],
    encode: impl Fn(&str) -> Result<Vec<u32>, DecideError>,
) -> Result<Option<(Vec<u32>, ReadTree)>, DecideError> {
    let mut at = Vec::with_capacity(lines.len());
    for k in 0..lines.len() {
        let m = marker(k);
        let Some(i) = text.find(&m) else { return Ok(None) };
        at.push((i, i + m.len()));
    }
    // the markers in order, each followed by its line's newline only
    let ordered = at.windows(2).all(|w| text.get(w[0].1..w[1].0) == Some("\n"));
    let (Some(&(first, _)), Some(&(_, last))) = (at.first(), at.last()) else {
        return Ok(None);
    };
    if !ordered || !text[last..].starts_with('\n') {
        return Ok(None);
    }
    let head = encode(&text[..first])?;
    let mut prompt = head.clone();
    let mut lens = Vec::with_capacity(lines.len());
    for l in lines {
        let t = encode(l)?;
        lens.push(t.len());
        prompt.extend(t);
    }
    let tail = encode(&text[last + 1..])?;
    if head.is_empty()
        || tail.is_empty()
        || lens.contains(&0)
        || prompt.len() - head.len() + tail.len() > MAX_TREE_TOKENS
    {
        return Ok(None);
    }
    let tree = tree(head.len(), &lens, tail.len());
    prompt.extend(tail);
    Ok(Some((prompt, tree)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branches_start_together_and_the_tail_sees_them_all() {
        let t = tree(10, &[2, 3], 2);
        assert_eq!(t.start, 10);
        let offsets: Vec<u32> = t.rows.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [0, 1, 0, 1, 2, 3, 4]);
        // the second branch's last row sees its own three rows only
        assert_eq!(t.rows[4].seen, [0b11100]);
        assert_eq!(t.rows[1].seen, [0b11]);
        assert_eq!(t.rows[6].seen, [0b1111111]);
        assert!(t.check(17).is_ok());
        assert!(t.check(18).is_err());
    }

    #[test]
    fn a_prompt_from_marked_text() {
        // one "token" per character
        let enc = |s: &str| Ok(s.chars().map(|c| c as u32).collect());
        let text = format!("<u>Q?\n{}\n{}\nPick.<a>", marker(0), marker(1));
        let lines = vec!["A: x\n".to_string(), "B: yy\n".to_string()];
        let (p, t) = prompt(&text, &lines, enc).unwrap().unwrap();
        let s: String = p.iter().map(|&c| char::from_u32(c).unwrap()).collect();
        assert_eq!(s, "<u>Q?\nA: x\nB: yy\nPick.<a>");
        assert_eq!(t.start, "<u>Q?\n".len());
        assert_eq!(t.rows.len(), s.len() - t.start);
        assert!(t.check(p.len()).is_ok());
        // markers the template moved apart: no set read
        let moved = format!("{} x {}\n", marker(0), marker(1));
        assert!(prompt(&moved, &lines, enc).unwrap().is_none());
        // options too long for a tree's masks: no set read
        let long = vec![
            "A: ".to_string() + &"x".repeat(MAX_TREE_TOKENS) + "\n",
            lines[1].clone(),
        ];
        assert!(prompt(&text, &long, enc).unwrap().is_none());
    }
}
