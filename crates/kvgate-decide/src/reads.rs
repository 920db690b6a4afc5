//! The reads of one decision and how their label probabilities become each question's
//! distribution. One read per question, except: a choice read `ordered` (see `crate::orders`) is one
//! read per option order, and a choice whose labels are several tokens — numbered labels beyond 26
//! options, or option names in a `cloze` read (the default) — adds branch reads (see `crate::trie`).
//! Every first read of the request is one engine decision (the state computed once, one fork per
//! read); branch reads follow, one engine decision per read, from the prefix cache.

use std::time::Duration;

use kvgate_engine::{metrics as m, DecideRequest, DecisionOutcome, DecisionRead, ReadResult, ReadTree, Usage};

use crate::error::DecideError;
use crate::labels::LabelSet;
use crate::orders::{combine, option_orders, ReadMethod};
use crate::priors::{calibrate, from_positions, mean_prior, to_positions};
use crate::render::{self, choice_labels, messages, messages_with, template_kwargs};
use crate::service::{DecisionService, Diagnostics};
use crate::set;
use crate::spec::{Content, DecisionSpec, Question, State};
use crate::temperature::temper;
use crate::trie::LabelTrie;

/// How a question's labels are read: single tokens (with their alias forms) in one read, or token
/// sequences through a [`LabelTrie`] (numbered choices beyond 26 options).
enum Labels {
    Single(Vec<Vec<u32>>),
    Trie(LabelTrie),
}

impl Labels {
    /// The first read's labels.
    fn first_read(&self) -> Vec<Vec<u32>> {
        match self {
            Labels::Single(ids) => ids.clone(),
            Labels::Trie(t) => t.first_tokens().into_iter().map(|t| vec![t]).collect(),
        }
    }
}

/// A cloze read's labels: each option's name as the reply starts it, through a trie; `None` where two
/// names cannot be told apart that way (one's tokens a prefix of another's), and the choice is read
/// by letter instead.
fn cloze_labels(st: &DecisionService, options: &[(String, Option<Content>)]) -> Option<Labels> {
    let seqs = options
        .iter()
        .map(|(n, _)| st.tokenizer.encode(n, false).ok())
        .collect::<Option<Vec<_>>>()?;
    LabelTrie::new(seqs).ok().map(Labels::Trie)
}

fn labels_for(st: &DecisionService, id: &str, q: &Question) -> Result<Labels, DecideError> {
    let cannot = |why: &str| {
        DecideError::field(
            "questions",
            format!(
                "question '{id}': this model cannot answer {} questions: {why}",
                q.kind()
            ),
        )
    };
    if let Question::Choice { options, .. } = q {
        if options.len() > 26 {
            let mut seqs = Vec::with_capacity(options.len());
            for l in choice_labels(options.len()) {
                seqs.push(st.tokenizer.encode(&l, false).map_err(|e| cannot(&e.to_string()))?);
            }
            return LabelTrie::new(seqs).map(Labels::Trie).map_err(|why| cannot(&why));
        }
    }
    let set: &LabelSet = match q {
        Question::Noul { .. } => &st.labels.noul,
        Question::Choice { .. } => &st.labels.choice,
        Question::Score { .. } => &st.labels.score,
    };
    let labels = set.as_ref().map_err(|why| cannot(why))?;
    let n = match q {
        Question::Noul { .. } => 2,
        Question::Choice { options, .. } => options.len(),
        Question::Score { levels, .. } => levels.len(),
    };
    if n > labels.len() {
        return Err(DecideError::field(
            "questions",
            format!(
                "question '{id}': {n} levels exceed the {} single-token labels this model has for {} questions",
                labels.len(),
                q.kind()
            ),
        ));
    }
    Ok(Labels::Single(labels[..n].iter().map(|l| l.ids.clone()).collect()))
}

/// Runs one engine decision to its result.
async fn decide(st: &DecisionService, req: DecideRequest) -> Result<DecisionOutcome, DecideError> {
    Ok(st.engine.decide(req)?.outcome().await?)
}

/// The branch reads of a multi-token-label question: its prompt plus each branch point's prefix,
/// after the first read put the prompt's full blocks in the prefix cache (so each costs the prompt's
/// last partial block and the prefix, not the question again). Returns each label's probability.
async fn read_trie(
    st: &DecisionService,
    trie: &LabelTrie,
    prompt: &[u32],
    first: &ReadResult,
    salt: &Option<String>,
    usage: &mut Usage,
) -> Result<Vec<f64>, DecideError> {
    if trie.branches().is_empty() {
        return Ok(trie.combine(&first.label_probs, &[]));
    }
    let reads = trie
        .branches()
        .iter()
        .map(|(prefix, next)| DecisionRead {
            prompt: prompt.iter().chain(prefix).copied().collect(),
            labels: next.iter().map(|&t| vec![t]).collect(),
            tree: None,
        })
        .collect();
    let DecisionOutcome {
        reads: results,
        usage: u,
        ..
    } = decide(
        st,
        DecideRequest {
            reads,
            cache_salt: salt.clone(),
            ..Default::default()
        },
    )
    .await?;
    usage.prompt_tokens += u.prompt_tokens;
    usage.cached_tokens += u.cached_tokens;
    let branch_probs: Vec<Vec<f64>> = results.into_iter().map(|r| r.label_probs).collect();
    Ok(trie.combine(&first.label_probs, &branch_probs))
}

/// What the reads of a request found.
pub(crate) struct Read {
    /// Per question (request order): the distribution over its options / levels / yes-no, summing to 1
    /// (or all zero when the model put no mass on any label).
    pub probs: Vec<Vec<f64>>,
    /// Per question: how it was read.
    pub diagnostics: Vec<Diagnostics>,
    /// Prompt and cached tokens over every read.
    pub usage: Usage,
    /// Breakpoint prefix tokens computed and kept.
    pub written_tokens: usize,
}

/// One read of the request.
struct Planned {
    question: usize,
    /// For a choice: the option at each listed position.
    order: Option<Vec<usize>>,
    labels: Labels,
    prompt: Vec<u32>,
    /// A set read's branches.
    tree: Option<ReadTree>,
    /// A choice read by option name ([`ReadMethod::cloze`]).
    cloze: bool,
}

/// The method `req` is read with on this engine: its own or the service's default (`set` needs tree
/// attention, else `ordered`).
fn read_method(st: &DecisionService, req: &DecisionSpec) -> ReadMethod {
    let read = req.read.unwrap_or(st.default_read);
    match st.engine.limits().tree_attention {
        true => read,
        false => read.without_trees(),
    }
}

/// The reads of `req` (one per question, or per option order of a choice), rendered and checked
/// against the context length.
fn plan(st: &DecisionService, req: &DecisionSpec, count: bool) -> Result<Vec<Planned>, DecideError> {
    let kwargs = template_kwargs();
    let method = read_method(st, req);
    let encode = |text: &str| {
        st.tokenizer
            .encode(text, false)
            .map_err(|e| DecideError::field("state", e.to_string()))
    };
    let mut plan: Vec<Planned> = vec![];
    for (qi, (id, q)) in req.questions.iter().enumerate() {
        let variants: Vec<(Option<Vec<usize>>, Question)> = match q {
            Question::Choice { instructions, options } => {
                let names: Vec<String> = options.iter().map(|(n, _)| n.clone()).collect();
                option_orders(&names, method, req.orders.unwrap_or(st.orders))
                    .into_iter()
                    .map(|order| {
                        let listed = order.iter().map(|&i| options[i].clone()).collect();
                        let q = Question::Choice {
                            instructions: instructions.clone(),
                            options: listed,
                        };
                        (Some(order), q)
                    })
                    .collect()
            }
            _ => vec![(None, q.clone())],
        };
        for (order, vq) in variants {
            // a cloze read: the choice answered by option name (by letter where names collide)
            let cloze = match &vq {
                Question::Choice { instructions, options } if method.cloze => {
                    cloze_labels(st, options).map(|l| (l, render::cloze_text(instructions, options)))
                }
                _ => None,
            };
            let is_cloze = cloze.is_some();
            let (labels, prompt, tree) = match cloze {
                Some((labels, question)) => {
                    let prompt = encode(&st.render(&messages_with(req, question), &kwargs)?)?;
                    (labels, prompt, None)
                }
                None => {
                    let labels = labels_for(st, id, &vq)?;
                    // a set read: the options as branches (the plain read of the canonical order
                    // when the question has no option lines or the template moved the markers)
                    let branched = match render::set_text(&vq).filter(|_| method.set) {
                        Some((question, lines)) => {
                            let text = st.render(&messages_with(req, question), &kwargs)?;
                            set::prompt(&text, &lines, encode)?
                        }
                        None => None,
                    };
                    match branched {
                        Some((p, t)) => (labels, p, Some(t)),
                        None => (labels, encode(&st.render(&messages(req, &vq), &kwargs)?)?, None),
                    }
                }
            };
            let longest = match &labels {
                Labels::Trie(t) => t.branches().iter().map(|(p, _)| p.len()).max().unwrap_or(0),
                Labels::Single(_) => 0,
            };
            check_len(st, id, prompt.len() + longest)?;
            plan.push(Planned {
                question: qi,
                order,
                cloze: is_cloze,
                labels,
                prompt,
                tree,
            });
        }
        if count {
            metrics::counter!(m::DECISION_QUESTIONS, "model_name" => st.model_name.clone(), "type" => q.kind())
                .increment(1);
        }
    }
    Ok(plan)
}

/// Refuses a read of `len` tokens (its prompt and longest label branch) past the context length.
fn check_len(st: &DecisionService, id: &str, len: usize) -> Result<(), DecideError> {
    if st.engine.limits().check_read(len).is_err() {
        return Err(DecideError::field(
            "state",
            format!(
                "question '{id}': the prompt is {len} tokens, more than this model's maximum context length of {} tokens",
                st.engine.limits().max_model_len
            ),
        ));
    }
    Ok(())
}

/// What a request writes to the prompt cache besides its session retention.
#[derive(Default)]
struct Writes {
    /// Per breakpoint: the first read's prefix (tokens) to keep, and for how long.
    breakpoints: Vec<(usize, Duration)>,
    /// No session retention.
    only: bool,
    /// Written tokens (out).
    written: usize,
}

/// The token boundaries of `req`'s breakpoints in its first read: each closing message rendered as
/// the prefix every read starts with, matched against the read's tokens (so a template that renders a
/// last message differently never moves the boundary past what the reads share).
fn writes_of(st: &DecisionService, req: &DecisionSpec, main: &[Planned]) -> Result<Writes, DecideError> {
    let mut w = Writes {
        only: req.breakpoints_only,
        ..Writes::default()
    };
    let (State::Conversation(_), Some(first), Some((_, q))) = (&req.state, main.first(), req.questions.first()) else {
        return Ok(w);
    };
    let msgs = messages(req, q);
    let offset = usize::from(req.instructions.is_some());
    for &k in &req.breakpoints {
        let Some(prefix) = msgs.get(..offset + k + 1) else {
            continue;
        };
        let text = st.render_prefix(prefix, &template_kwargs())?;
        let ids = st
            .tokenizer
            .encode(&text, false)
            .map_err(|e| DecideError::field("messages", e.to_string()))?;
        let n = ids.iter().zip(&first.prompt).take_while(|(a, b)| a == b).count();
        w.breakpoints.push((n, req.breakpoint_ttl));
    }
    Ok(w)
}

/// Runs planned reads: per question, its distribution (orders combined) and mean label mass.
async fn execute(
    st: &DecisionService,
    plan: &[Planned],
    questions: usize,
    salt: &Option<String>,
    keep: Option<(Duration, Option<u32>)>,
    writes: Option<&mut Writes>,
    usage: &mut Usage,
) -> Result<Vec<(Vec<f64>, f64)>, DecideError> {
    let (breakpoints, only) = writes
        .as_ref()
        .map_or((vec![], false), |w| (w.breakpoints.clone(), w.only));
    let DecisionOutcome {
        reads: results,
        usage: u,
        written_tokens,
    } = decide(
        st,
        DecideRequest {
            reads: plan
                .iter()
                .map(|p| DecisionRead {
                    prompt: p.prompt.clone(),
                    labels: p.labels.first_read(),
                    tree: p.tree.clone(),
                })
                .collect(),
            cache_salt: salt.clone(),
            keep_alive: keep.map(|k| k.0),
            tenant: keep.and_then(|k| k.1),
            breakpoints,
            breakpoints_only: only,
        },
    )
    .await?;
    if let Some(w) = writes {
        w.written = written_tokens;
    }
    usage.prompt_tokens += u.prompt_tokens;
    usage.cached_tokens += u.cached_tokens;
    // Multi-token labels: their branch reads, one engine request per read, concurrently.
    let mut extra = vec![Usage::default(); plan.len()];
    let futs = plan
        .iter()
        .zip(&results)
        .zip(extra.iter_mut())
        .map(|((p, r), u)| async move {
            match &p.labels {
                Labels::Trie(t) => read_trie(st, t, &p.prompt, r, salt, u).await,
                Labels::Single(_) => Ok(r.label_probs.clone()),
            }
        });
    let per_read: Vec<Vec<f64>> = futures::future::join_all(futs)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    for u in extra {
        usage.prompt_tokens += u.prompt_tokens;
        usage.cached_tokens += u.cached_tokens;
    }
    Ok((0..questions)
        .map(|qi| {
            let idx: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].question == qi).collect();
            let mass = idx.iter().map(|&i| results[i].label_mass).sum::<f64>() / idx.len().max(1) as f64;
            let p = match &plan[idx[0]].order {
                Some(_) => {
                    let orders: Vec<Vec<usize>> = idx.iter().filter_map(|&i| plan[i].order.clone()).collect();
                    let reads: Vec<Vec<f64>> = idx.iter().map(|&i| per_read[i].clone()).collect();
                    combine(&orders, &reads)
                }
                None => per_read[idx[0]].clone(),
            };
            (p, mass)
        })
        .collect())
}

/// The states content-free reads put where the request's state was. A question's prior is the mean of
/// its label distributions over all of them (Calibrate Before Use's three): one content-free string
/// carries its own lean ("N/A" reads as an answer of sorts), their mean less so.
const CONTENT_FREE: [&str; 3] = ["N/A", "", "[MASK]"];

/// Plans, runs and combines every read of `req`. With calibration, each question's content-free prior
/// comes from the service's [`crate::priors::PriorCache`] when this question shape was seen before; else
/// the same reads over each content-free state run alongside the request's (an engine decision each) and
/// the prior is kept. Each question's label prior is divided out (numbered choices beyond 26 options
/// are left uncalibrated), then its type's temperature (`--decision-temperature`) applied.
pub(crate) async fn run(st: &DecisionService, req: &DecisionSpec) -> Result<Read, DecideError> {
    let main = plan(st, req, true)?;
    let mut writes = writes_of(st, req, &main)?;
    let n = req.questions.len();
    let mut usage = Usage::default();
    let keep = req.keep_alive.map(|k| (k, req.tenant));
    // numbered labels (a choice beyond 26 options) stay uncalibrated; a cloze read's names are
    // calibrated through the same trie
    let is_trie = |qi: usize| {
        main.iter()
            .any(|r| r.question == qi && !r.cloze && matches!(r.labels, Labels::Trie(_)))
    };
    // per question: the prior (None: uncalibrated), and whether it came from the cache
    let mut priors: Vec<(Option<Vec<f64>>, bool)> = vec![(None, false); n];
    let mut answers = if read_method(st, req).calibrated {
        let mut cf = req.clone();
        let mut prior_plan = |state: &str| {
            cf.state = State::Text(state.to_string());
            plan(st, &cf, false)
        };
        // a shape is keyed by its reads over the first state: the others' prompts follow from the same
        // question with a fixed state each, so they are planned only when the prior must be read
        let first_plan = prior_plan(CONTENT_FREE[0])?;
        // a set read's prior is kept apart from a causal read's of the same tokens
        let prior_salt = match read_method(st, req).set {
            true => Some(format!("{}\u{0}set", req.cache_salt.as_deref().unwrap_or(""))),
            false => req.cache_salt.clone(),
        };
        let shapes: Vec<_> = (0..n)
            .map(|qi| {
                let reads = first_plan.iter().filter(|r| r.question == qi);
                let labels: Vec<Vec<Vec<u32>>> = reads.clone().map(|r| r.labels.first_read()).collect();
                st.priors.shape(
                    prior_salt.as_deref(),
                    reads.zip(&labels).map(|(r, l)| (r.prompt.as_slice(), l.as_slice())),
                )
            })
            .collect();
        // the questions whose prior must be read, renumbered in the plan of those reads
        let mut todo: Vec<usize> = vec![];
        // a prior is kept by listed position of the question's first read (the options in the order its
        // text lists them, which the key covers), so that another listing of the same options maps back
        let first_order = |qi: usize| main.iter().find(|r| r.question == qi).and_then(|r| r.order.clone());
        // yes/no questions are calibrated only where that was measured to help (`Fitted`)
        let calibrates = |qi: usize| st.yes_no_calibration || !matches!(req.questions[qi].1, Question::Noul { .. });
        for qi in (0..n).filter(|&qi| !is_trie(qi) && calibrates(qi)) {
            match st.priors.get(shapes[qi]) {
                Some(by_pos) => priors[qi] = (Some(from_positions(&by_pos, first_order(qi))), true),
                None => todo.push(qi),
            }
        }
        // each content-free state's reads are one engine decision of their own (question k: the k-th
        // in `todo`), so that none needs more of the cache at once than the request's own read does
        let mut todo_plans: Vec<Vec<Planned>> = vec![];
        if !todo.is_empty() {
            let rest = CONTENT_FREE[1..].iter().map(|state| prior_plan(state));
            for plan in std::iter::once(Ok(first_plan)).chain(rest) {
                let renumbered = plan?.into_iter().filter_map(|mut r| {
                    r.question = todo.iter().position(|&q| q == r.question)?;
                    Some(r)
                });
                todo_plans.push(renumbered.collect());
            }
        }
        let mut prior_usage = vec![Usage::default(); CONTENT_FREE.len()];
        let main_read = execute(st, &main, n, &req.cache_salt, keep, Some(&mut writes), &mut usage);
        let (a, by_state) = if todo.is_empty() {
            (main_read.await, vec![])
        } else {
            let prior_reads = futures::future::join_all(
                todo_plans
                    .iter()
                    .zip(prior_usage.iter_mut())
                    .map(|(plan, u)| execute(st, plan, todo.len(), &req.cache_salt, None, None, u)),
            );
            let (a, b) = futures::future::join(main_read, prior_reads).await;
            (a, b.into_iter().collect::<Result<Vec<_>, _>>()?)
        };
        for (k, &qi) in todo.iter().enumerate() {
            let p = mean_prior(by_state.iter().map(|reads| reads[k].0.as_slice()));
            st.priors.put(shapes[qi], to_positions(&p, first_order(qi)));
            priors[qi] = (Some(p), false);
        }
        a?
    } else {
        execute(st, &main, n, &req.cache_salt, keep, Some(&mut writes), &mut usage).await?
    };
    let temps = st.temperature;
    let mut diagnostics = Vec::with_capacity(n);
    for (qi, (p, mass)) in answers.iter_mut().enumerate() {
        let first = main.iter().find(|r| r.question == qi);
        let orders = main.iter().filter(|r| r.question == qi).count();
        let set = first.is_some_and(|r| r.tree.is_some());
        let cloze = first.is_some_and(|r| r.cloze);
        let ordered = first.is_some_and(|r| r.order.is_some()) && read_method(st, req).ordered && !set;
        let (prior, cached) = &priors[qi];
        if let Some(pr) = prior {
            *p = calibrate(p, pr);
        }
        let t = temps.of(&req.questions[qi].1);
        *p = temper(p, t);
        let method = ReadMethod {
            ordered,
            calibrated: prior.is_some(),
            set,
            cloze,
        }
        .name();
        diagnostics.push(Diagnostics {
            label_mass: *mass,
            x_read: method,
            x_orders: orders,
            x_temperature: t,
            x_prior: prior.as_ref().map(|_| if *cached { "cached" } else { "computed" }),
        });
    }
    Ok(Read {
        probs: answers.into_iter().map(|(p, _)| p).collect(),
        diagnostics,
        usage,
        written_tokens: writes.written,
    })
}
