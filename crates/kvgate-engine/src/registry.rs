//! The sequence registry: every live sequence and group (one request: a completion with its `n`
//! choices, or a decision with its reads) the scheduler knows, under typed ids.
//!
//! Guarantees: ids are never reused within a registry; every lookup returns a [`SchedError`] for an
//! unknown id instead of panicking, so a bookkeeping bug fails the step (and the requests in it), not
//! the process.

use std::collections::HashMap;
use std::fmt;

use thiserror::Error;

use crate::kv_manager::SeqBlocks;
use crate::layout::DecisionState;

/// A sequence id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(u64);

/// A group (request) id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(u64);

impl GroupId {
    /// Its number (a tag that crosses a channel).
    pub(crate) fn raw(self) -> u64 {
        self.0
    }

    /// The group numbered `n` (what [`GroupId::raw`] gave).
    pub(crate) fn from_raw(n: u64) -> GroupId {
        GroupId(n)
    }
}

#[cfg(test)]
impl SeqId {
    /// A sequence id made up by a test.
    pub(crate) fn test(n: u64) -> SeqId {
        SeqId(n)
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq#{}", self.0)
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "group#{}", self.0)
    }
}

/// A bookkeeping failure of the scheduler: an id that names nothing (a bug, reported rather than
/// panicking).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SchedError {
    /// No live sequence has this id.
    #[error("scheduler: no sequence {0}")]
    UnknownSeq(SeqId),
    /// No live group has this id.
    #[error("scheduler: no group {0}")]
    UnknownGroup(GroupId),
    /// A sequence's table has no block for a position it is scheduled at.
    #[error("scheduler: {seq} has no block for position {pos}")]
    NoBlock {
        /// The sequence.
        seq: SeqId,
        /// The position.
        pos: usize,
    },
    /// A decision operation on a completion group.
    #[error("scheduler: {0} is not a decision")]
    NotADecision(GroupId),
    /// A verification kept more proposed tokens than the sequence's step ran or than it now holds.
    #[error("scheduler: {seq} kept {accepted} of {proposed} proposed tokens")]
    BadAccept {
        /// The sequence.
        seq: SeqId,
        /// Tokens said kept.
        accepted: usize,
        /// Tokens its last step proposed.
        proposed: usize,
    },
}

/// A sequence.
#[derive(Debug, Clone)]
pub(crate) struct Seq {
    /// Owning group.
    pub(crate) group: GroupId,
    /// All known tokens: prompt, then generated ones.
    pub(crate) tokens: Vec<u32>,
    /// Tokens whose K/V are in the cache.
    pub(crate) computed: usize,
    /// Its block table.
    pub(crate) blocks: SeqBlocks,
    /// Logits for every prompt row (prompt logprobs; disables prefix matching).
    pub(crate) all_logits: bool,
    /// Its tokens before the first tree token (a decision read's [`crate::ReadTree`]): only blocks
    /// wholly before it are matched or registered in the prefix cache (`usize::MAX`: all).
    pub(crate) plain_upto: usize,
    /// Whether it produces logits at all (a decision's shared prefix does not).
    pub(crate) wants_logits: bool,
    /// For a decision's question sequence: the index of its read.
    pub(crate) read: Option<usize>,
    /// Whether its table was prefix-matched since it last had no blocks.
    pub(crate) matched: bool,
    /// Its speculation state.
    pub(crate) spec: SeqSpec,
}

/// A sequence's speculation state ([`crate::speculation`], [`crate::scheduler`]'s `speculate`).
#[derive(Debug, Clone)]
pub(crate) struct SeqSpec {
    /// Tokens proposed for its current decode chunk, verified by its request kind.
    pub(crate) draft: Vec<u32>,
    /// Most tokens its request kind lets it propose (0: it never speculates; see
    /// [`crate::scheduler::StepUpdate::spec_limit`]).
    pub(crate) limit: usize,
    /// What a draft model proposed for its next decode chunk ([`crate::draft`]).
    pub(crate) drafted: Vec<u32>,
    /// Where its last prompt-lookup proposal came from (a copy in progress goes on there).
    pub(crate) cursor: Option<crate::speculation::Cursor>,
    /// Its current proposal length (adapted to its own acceptance, [`crate::speculation::next_len`]).
    pub(crate) len: usize,
    /// How much of its proposals it keeps lately (whether it speculates past `max_batch`).
    pub(crate) keep: crate::speculation::Keep,
    /// When its current proposal is a token tree ([`crate::token_tree`]): one node per token of
    /// `draft`, and per node where in its tokens that proposal was copied from; empty for one path.
    pub(crate) tree: Vec<crate::token_tree::TreeNode>,
    pub(crate) sources: Vec<usize>,
    /// The length of the first proposal of its tree (the one its proposal length adapts to).
    pub(crate) main: usize,
    /// How much its trees have been paying lately (whether it proposes them).
    pub(crate) branching: crate::speculation::Branching,
}

impl Default for SeqSpec {
    fn default() -> SeqSpec {
        SeqSpec {
            draft: Vec::new(),
            limit: 0,
            drafted: Vec::new(),
            cursor: None,
            len: 1,
            keep: crate::speculation::Keep::default(),
            tree: Vec::new(),
            sources: Vec::new(),
            main: 0,
            branching: crate::speculation::Branching::default(),
        }
    }
}

/// What a group is.
#[derive(Debug, Clone)]
pub(crate) enum GroupKind {
    /// A completion: one sequence, forked into `n` once its prompt is computed.
    Generate,
    /// A decision: a shared-prefix sequence, forked into one sequence per read.
    Decide(DecisionState),
}

/// A group: the unit of admission and preemption.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// Arrival order (preemption victims are the newest).
    pub(crate) order: u64,
    /// Prefix-cache isolation key.
    pub(crate) salt: String,
    /// For a fast-path completion, the exact path's key: it may also read those blocks (see
    /// [`crate::kv_manager::Salts`]).
    pub(crate) exact_salt: Option<String>,
    /// Live sequences.
    pub(crate) seqs: Vec<SeqId>,
    pub(crate) kind: GroupKind,
    pub(crate) running: bool,
    pub(crate) admitted_once: bool,
    pub(crate) cached_tokens: usize,
    pub(crate) decision_warmed_tokens: usize,
    pub(crate) computed_tokens: usize,
    /// The scheduler's clock when it arrived (admission's starvation bound).
    pub(crate) arrived: u64,
    /// When its session's state has been held since without a break (the first turn's pin), once it
    /// took a retained state over: the pin it takes at its end keeps that start.
    pub(crate) held_since: Option<u64>,
}

/// The live sequences and groups.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    seqs: HashMap<SeqId, Seq>,
    groups: HashMap<GroupId, Group>,
    next_id: u64,
    next_order: u64,
}

impl Registry {
    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A sequence.
    pub(crate) fn seq(&self, id: SeqId) -> Result<&Seq, SchedError> {
        self.seqs.get(&id).ok_or(SchedError::UnknownSeq(id))
    }

    /// A sequence, mutably.
    pub(crate) fn seq_mut(&mut self, id: SeqId) -> Result<&mut Seq, SchedError> {
        self.seqs.get_mut(&id).ok_or(SchedError::UnknownSeq(id))
    }

    /// A group.
    pub(crate) fn group(&self, id: GroupId) -> Result<&Group, SchedError> {
        self.groups.get(&id).ok_or(SchedError::UnknownGroup(id))
    }

    /// A group, mutably.
    pub(crate) fn group_mut(&mut self, id: GroupId) -> Result<&mut Group, SchedError> {
        self.groups.get_mut(&id).ok_or(SchedError::UnknownGroup(id))
    }

    #[cfg(test)]
    /// Whether a group is live.
    pub(crate) fn has_group(&self, id: GroupId) -> bool {
        self.groups.contains_key(&id)
    }

    #[cfg(test)]
    /// Number of live groups.
    pub(crate) fn num_groups(&self) -> usize {
        self.groups.len()
    }

    #[cfg(test)]
    /// Every live sequence.
    pub(crate) fn seqs(&self) -> impl Iterator<Item = &Seq> {
        self.seqs.values()
    }

    /// Registers a new group (with no sequences yet), newest in arrival order.
    pub(crate) fn add_group(&mut self, kind: GroupKind, salt: String, arrived: u64) -> GroupId {
        let id = GroupId(self.new_id());
        self.next_order += 1;
        self.groups.insert(
            id,
            Group {
                order: self.next_order,
                salt,
                exact_salt: None,
                seqs: vec![],
                kind,
                running: false,
                admitted_once: false,
                cached_tokens: 0,
                decision_warmed_tokens: 0,
                computed_tokens: 0,
                arrived,
                held_since: None,
            },
        );
        id
    }

    /// Registers a new sequence of `group` with no blocks (the caller lists it in the group).
    pub(crate) fn add_seq(&mut self, group: GroupId, tokens: Vec<u32>, all_logits: bool, wants_logits: bool) -> SeqId {
        let id = SeqId(self.new_id());
        self.seqs.insert(
            id,
            Seq {
                group,
                tokens,
                computed: 0,
                blocks: SeqBlocks::default(),
                all_logits,
                wants_logits,
                read: None,
                matched: false,
                spec: SeqSpec::default(),
                plain_upto: usize::MAX,
            },
        );
        id
    }

    /// Removes a sequence (the caller releases its blocks).
    pub(crate) fn remove_seq(&mut self, id: SeqId) -> Result<Seq, SchedError> {
        self.seqs.remove(&id).ok_or(SchedError::UnknownSeq(id))
    }

    /// Removes a group (its sequences must be gone already).
    pub(crate) fn remove_group(&mut self, id: GroupId) -> Option<Group> {
        self.groups.remove(&id)
    }
}
