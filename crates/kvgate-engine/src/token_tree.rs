//! Token trees of speculation: several proposals for one sequence (prompt lookup's continuations
//! from different places) merged into one tree and verified in one pass, the longest path the
//! sampler agrees with kept.
//!
//! A tree is laid out after the chunk's first row (the sequence's last token, at position `start`):
//! the first proposal exactly as a single path (node of depth `d` at `start + d`), each further
//! proposal's new nodes after everything laid out so far, at slots the backend's [`TreeGrain`] lets
//! them compute what they would compute at `start + depth` — so a kept row's logits, and the K/V it
//! wrote, are bitwise those of the plain sequence, and greedy text and seeded draws stay exactly
//! what decoding without speculation gives. A node that cannot be placed so (its partition ends
//! first) is dropped with the rest of its proposal. Nodes come in chunk-row order with parents
//! before children, siblings never share a token, and the tree holds at most the nodes it was given
//! room for.
//!
//! Once a path is kept, its rows that do not sit at their plain positions are copied there
//! ([`moves`]: bitwise, slot by slot, in depth order — a move never overwrites a later one's source).

use kvgate_backend::{SlotCopy, TreeGrain};

/// One proposed token of a tree: node `i` is chunk row `1 + i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeNode {
    /// The chunk row it follows: 0 for the chunk's first row, `1 + j` for node `j` (always earlier).
    pub parent: usize,
    /// Its slot's offset from the chunk's first row (at least its depth).
    pub at: usize,
    /// Its depth: its plain position is the chunk's start plus it.
    pub depth: usize,
}

/// A tree built from proposals: its tokens (one per node), its nodes, and per node the index in the
/// sequence's own tokens its proposal was copied from (where a kept path's copy goes on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tree {
    pub(crate) tokens: Vec<u32>,
    pub(crate) nodes: Vec<TreeNode>,
    pub(crate) from: Vec<usize>,
}

impl Tree {
    /// Merges `proposals` (each: its tokens, and where in the sequence they were copied from) into a
    /// tree after a chunk starting at position `start`, with at most `max_nodes` nodes; the first
    /// proposal keeps the single path's layout.
    pub(crate) fn build(proposals: &[(&[u32], usize)], start: usize, grain: TreeGrain, max_nodes: usize) -> Tree {
        let mut t = Tree::default();
        // the next free slot offset
        let mut free = 1;
        for &(tokens, from) in proposals {
            // follow what the tree already holds
            let mut parent = 0;
            let mut depth = 0;
            let mut rest = tokens;
            while let Some((&tok, tail)) = rest.split_first() {
                match t.child(parent, tok) {
                    Some(row) => {
                        parent = row;
                        depth += 1;
                        rest = tail;
                    }
                    None => break,
                }
            }
            if rest.is_empty() {
                continue;
            }
            // the new nodes: from the first offset at or after `free` in the lane of their plain slot
            let plain = depth + 1;
            let lanes = grain.lanes.max(1);
            let mut at = free + (plain + lanes - free % lanes) % lanes;
            if t.nodes.is_empty() {
                at = plain;
            }
            for &tok in rest {
                depth += 1;
                if t.nodes.len() >= max_nodes || !grain.fits(start + depth, start + at) {
                    break;
                }
                t.nodes.push(TreeNode { parent, at, depth });
                t.tokens.push(tok);
                t.from.push(from);
                parent = t.nodes.len();
                free = at + 1;
                at += 1;
            }
        }
        t
    }

    /// The row of `parent`'s child holding `tok`, if any.
    pub(crate) fn child(&self, parent: usize, tok: u32) -> Option<usize> {
        child(&self.nodes, &self.tokens, parent, tok)
    }

    /// Whether it is more than one path (a single path runs as an ordinary proposal).
    pub(crate) fn branches(&self) -> bool {
        self.nodes.iter().enumerate().any(|(i, n)| n.parent != i)
    }

    /// The slots after the chunk's first row it spans.
    pub(crate) fn span(&self) -> usize {
        self.nodes.iter().map(|n| n.at).max().unwrap_or(0)
    }
}

/// The row (`1 + i` for node `i`, whose token is `tokens[i]`) of row `parent`'s child holding `tok`,
/// if any (siblings never share a token).
pub(crate) fn child(nodes: &[TreeNode], tokens: &[u32], parent: usize, tok: u32) -> Option<usize> {
    nodes
        .iter()
        .zip(tokens)
        .position(|(n, &t)| n.parent == parent && t == tok)
        .map(|i| i + 1)
}

/// The slot offset of a chunk's row `i` from its first row: its node's in a tree, `i` otherwise.
pub(crate) fn offset(tree: &[TreeNode], i: usize) -> usize {
    i.checked_sub(1).and_then(|j| tree.get(j)).map_or(i, |n| n.at)
}

/// The RoPE position and mask of a chunk's row `i` (`start` its first row's position) when it is a
/// tree node: its plain position, and the positions of its ancestors and its own beyond `start`.
pub(crate) fn row(tree: &[TreeNode], start: usize, i: usize) -> Option<(u32, kvgate_backend::RowMask)> {
    let node = tree.get(i.checked_sub(1)?)?;
    let mut seen = vec![0u64; node.at.div_ceil(64)];
    let mut r = i;
    // parents come before children: the walk ends at the first row
    while let Some(n) = r.checked_sub(1).and_then(|j| tree.get(j)) {
        let b = n.at - 1;
        if let Some(w) = seen.get_mut(b / 64) {
            *w |= 1 << (b % 64);
        }
        r = n.parent;
    }
    Some((
        (start + node.depth) as u32,
        kvgate_backend::RowMask {
            base: start as u32 + 1,
            seen,
        },
    ))
}

/// The copies that put kept path `rows` (chunk rows, root first excluded, in depth order) where the
/// sequence reads them: `slot(start + at) → slot(start + depth)` for each row not already there.
pub(crate) fn moves(nodes: &[TreeNode], rows: &[usize], start: usize, slot: impl Fn(usize) -> usize) -> Vec<SlotCopy> {
    rows.iter()
        .filter_map(|&r| nodes.get(r.checked_sub(1)?))
        .filter(|n| n.at != n.depth)
        .map(|n| SlotCopy {
            src: slot(start + n.at),
            dst: slot(start + n.depth),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const GRAIN: TreeGrain = TreeGrain {
        lanes: 8,
        partition: 256,
    };

    #[test]
    fn the_first_proposal_is_a_single_path_and_others_branch_in_their_lanes() {
        let a = [1, 2, 3, 4];
        let b = [1, 2, 7, 8];
        let c = [9];
        let t = Tree::build(&[(&a, 10), (&b, 20), (&c, 30)], 100, GRAIN, 16);
        assert_eq!(t.tokens, vec![1, 2, 3, 4, 7, 8, 9]);
        let at: Vec<usize> = t.nodes.iter().map(|n| n.at).collect();
        let depth: Vec<usize> = t.nodes.iter().map(|n| n.depth).collect();
        let parent: Vec<usize> = t.nodes.iter().map(|n| n.parent).collect();
        // b's new nodes (depth 3, 4) start at 11 (≡ 3 mod 8); c's (depth 1) at 17 (≡ 1)
        assert_eq!(at, vec![1, 2, 3, 4, 11, 12, 17]);
        assert_eq!(depth, vec![1, 2, 3, 4, 3, 4, 1]);
        assert_eq!(parent, vec![0, 1, 2, 3, 2, 5, 0]);
        assert_eq!(t.from, vec![10, 10, 10, 10, 20, 20, 30]);
        assert!(t.branches());
        assert_eq!(t.span(), 17);
        assert_eq!(t.child(2, 7), Some(5));
        assert_eq!(t.child(0, 9), Some(7));
        // row 6 (b's second new node) sees rows 1, 2, 5 and itself: offsets 1, 2, 11, 12
        let (rope, mask) = row(&t.nodes, 100, 6).unwrap();
        assert_eq!(rope, 104);
        let seen: Vec<usize> = (101..=117).filter(|&p| mask.sees(p)).collect();
        assert_eq!(seen, vec![101, 102, 111, 112]);
        assert!(mask.sees(100) && mask.sees(3));
        assert_eq!(row(&t.nodes, 100, 0), None);
        // a kept path through b: rows 1, 2, 5, 6 → the last two move to depth 3, 4
        let m = moves(&t.nodes, &[1, 2, 5, 6], 100, |p| 1000 + p);
        assert_eq!(
            m,
            vec![SlotCopy { src: 1111, dst: 1103 }, SlotCopy { src: 1112, dst: 1104 }]
        );
    }

    #[test]
    fn a_proposal_held_already_adds_nothing_and_one_path_is_no_tree() {
        let a = [1, 2, 3];
        let t = Tree::build(&[(&a, 0), (&a[..2], 5)], 0, GRAIN, 8);
        assert_eq!(t.tokens, vec![1, 2, 3]);
        assert!(!t.branches());
    }

    #[test]
    fn nodes_stop_at_the_room_and_at_a_partition_end() {
        let a = [1, 2, 3];
        let b = [4, 5, 6];
        let t = Tree::build(&[(&a, 0), (&b, 0)], 0, GRAIN, 4);
        assert_eq!(t.tokens, vec![1, 2, 3, 4]);
        // start 250: b's nodes would sit at 259.. while their plain slots are 251..: another partition
        let t = Tree::build(&[(&a, 0), (&b, 0)], 250, GRAIN, 16);
        assert_eq!(t.tokens, vec![1, 2, 3]);
    }

    /// Random proposals: every node's parent is earlier, siblings differ, every node fits the grain,
    /// no two nodes share a slot, and the first proposal's nodes sit at their depths.
    #[test]
    fn random_trees_keep_their_invariants() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..500 {
            let n = rng.random_range(1..5);
            let props: Vec<Vec<u32>> = (0..n)
                .map(|_| (0..rng.random_range(1..9)).map(|_| rng.random_range(0..3)).collect())
                .collect();
            let refs: Vec<(&[u32], usize)> = props.iter().map(|p| (p.as_slice(), 0)).collect();
            let start = rng.random_range(0..600);
            let max = rng.random_range(1..20);
            let t = Tree::build(&refs, start, GRAIN, max);
            let mut slots = std::collections::HashSet::new();
            for (i, nd) in t.nodes.iter().enumerate() {
                assert!(nd.parent <= i);
                let pd = if nd.parent == 0 {
                    0
                } else {
                    t.nodes[nd.parent - 1].depth
                };
                assert_eq!(nd.depth, pd + 1);
                assert!(GRAIN.fits(start + nd.depth, start + nd.at));
                assert!(slots.insert(nd.at));
                assert_eq!(t.child(nd.parent, t.tokens[i]), Some(i + 1), "siblings differ");
            }
            // the first proposal is laid out as a single path
            for (i, nd) in t.nodes.iter().take(props[0].len().min(max)).enumerate() {
                assert_eq!((nd.at, nd.depth, t.tokens[i]), (i + 1, i + 1, props[0][i]));
            }
        }
    }
}
