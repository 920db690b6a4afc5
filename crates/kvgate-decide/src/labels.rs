//! The single-token labels System One answers are read from, found once at model load for this
//! tokenizer: `yes` / `no` for noul, `A`…`Z` for choice options (numbered options beyond 26 are
//! multi-token labels, read through `crate::trie`), `0`…`9` for score levels. Each label's
//! alias forms (capitalised, upper-case, with a leading space: `Yes`, ` yes`, `A` vs ` A`) that are
//! single tokens too are summed into it. A label set whose base forms are not all single tokens is
//! unavailable, and questions of that type get a 400 naming why.

use kvgate_model::Tokenizer;

/// One label: its text and the token ids summed into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// The label as shown in the prompt.
    pub text: String,
    /// Token ids of its alias forms (the base form first).
    pub ids: Vec<u32>,
}

/// A label set, or why this tokenizer cannot provide it.
pub type LabelSet = Result<Vec<Label>, String>;

/// The three label sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelTable {
    /// `yes`, `no`.
    pub noul: LabelSet,
    /// `A`…`Z`.
    pub choice: LabelSet,
    /// `0`…`9`.
    pub score: LabelSet,
}

fn single(tok: &Tokenizer, s: &str) -> Option<u32> {
    match tok.encode(s, false).ok()?.as_slice() {
        [id] => Some(*id),
        _ => None,
    }
}

fn build(tok: &Tokenizer, labels: &[&str], case_aliases: bool) -> LabelSet {
    let mut out: Vec<Label> = Vec::with_capacity(labels.len());
    for &l in labels {
        let base = single(tok, l).ok_or_else(|| {
            let n = tok.encode(l, false).map(|v| v.len()).unwrap_or(0);
            format!("the label {l:?} is {n} tokens for this model's tokenizer, not one")
        })?;
        let mut ids = vec![base];
        let mut forms = vec![format!(" {l}")];
        let cap = {
            let mut c = l.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        };
        if case_aliases {
            for f in [cap.clone(), l.to_uppercase()] {
                forms.push(f.clone());
                forms.push(format!(" {f}"));
            }
        }
        for f in forms {
            if let Some(id) = single(tok, &f) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        out.push(Label {
            text: l.to_string(),
            ids,
        });
    }
    // Aliases must never be shared between labels (e.g. "A" and "a" are different labels only if
    // they are distinct tokens); keep each id with the first label that claimed it as its base, else
    // the first that found it.
    let bases: Vec<u32> = out.iter().map(|l| l.ids[0]).collect();
    let mut seen = std::collections::HashSet::new();
    for l in out.iter_mut() {
        let base = l.ids[0];
        l.ids
            .retain(|id| (*id == base || !bases.contains(id)) && seen.insert(*id));
        if l.ids.first() != Some(&base) {
            return Err(format!("the label {:?} shares its token with another label", l.text));
        }
    }
    Ok(out)
}

impl LabelTable {
    /// Finds every label set for `tok`.
    pub fn new(tok: &Tokenizer) -> LabelTable {
        let letters: Vec<String> = ('A'..='Z').map(|c| c.to_string()).collect();
        let letters: Vec<&str> = letters.iter().map(String::as_str).collect();
        let digits: Vec<String> = (0..10).map(|d| d.to_string()).collect();
        let digits: Vec<&str> = digits.iter().map(String::as_str).collect();
        LabelTable {
            noul: build(tok, &["yes", "no"], true),
            // Letters keep their case: " a" is the article, not option A.
            choice: build(tok, &letters, false),
            score: build(tok, &digits, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_model::tiny::tiny_tokenizer;

    #[test]
    fn tiny_tokenizer_labels() {
        let t = LabelTable::new(&tiny_tokenizer());
        let noul = t.noul.unwrap();
        assert_eq!(noul[0].text, "yes");
        assert!(noul[0].ids.len() >= 3, "yes, Yes, ' yes' ... {:?}", noul[0].ids);
        assert_eq!(t.choice.unwrap().len(), 26);
        assert_eq!(t.score.unwrap().len(), 10);
        let all: Vec<u32> = noul.iter().flat_map(|l| l.ids.clone()).collect();
        let mut d = all.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), all.len(), "aliases are disjoint");
    }
}
