//! An item being streamed (a message's text or the reasoning) and the events that open, extend and
//! close it, each with the item's place in the output.

use super::super::wire::{OutputItem, OutputText, TextDelta, TextDone, WithItem, WithPart};
use crate::pipeline::openai::response::TokenLogprobOut;

/// The text item being streamed.
pub(super) struct OpenText {
    pub(super) index: usize,
    pub(super) id: String,
    pub(super) text: String,
    /// Its tokens' logprobs, when asked.
    pub(super) logprobs: Vec<TokenLogprobOut>,
}

pub(super) fn item(output_index: usize, item: OutputItem) -> WithItem {
    WithItem {
        sequence_number: 0,
        output_index,
        item,
    }
}

pub(super) fn part(o: &OpenText, part: OutputText) -> WithPart {
    WithPart {
        sequence_number: 0,
        item_id: o.id.clone(),
        output_index: o.index,
        content_index: 0,
        part,
    }
}

pub(super) fn delta(o: &OpenText, delta: String, logprobs: Option<Vec<TokenLogprobOut>>) -> TextDelta {
    TextDelta {
        sequence_number: 0,
        item_id: o.id.clone(),
        output_index: o.index,
        content_index: 0,
        delta,
        logprobs,
    }
}

pub(super) fn done(o: &OpenText, logprobs: Option<Vec<TokenLogprobOut>>) -> TextDone {
    TextDone {
        sequence_number: 0,
        item_id: o.id.clone(),
        output_index: o.index,
        content_index: 0,
        text: o.text.clone(),
        logprobs,
    }
}
