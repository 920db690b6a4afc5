//! A forward pass inside the rayon pool with the pool's other workers kept hot: while it runs, every
//! other worker spins in a job that takes the pass's parallel work as soon as it is pushed
//! (`rayon::yield_now`), instead of going to sleep between two matmuls and being woken by a futex for
//! the next one. A decode step is ~150 parallel sections separated by a few microseconds of serial
//! work (norms, RoPE, the KV write), and on a virtual machine each sleep/wake pair costs tens of
//! microseconds and a context switch: `perf` put ~7% of a Qwen2.5-0.5B decode step in the scheduler
//! before this.
//!
//! Guarantees: the result is `f`'s (the spinners only run jobs the pass itself pushes, or other pool
//! work, so no arithmetic changes); the spinners stop when `f` returns or unwinds (a drop guard raises
//! the flag), so the scope always ends; a spinner that lands on the pass's own thread returns at once
//! (that thread only takes its own queued jobs while waiting on one of its joins, and a spinner there
//! would wait on itself). The spinners are queued before any of the pass's jobs, and a stealer takes
//! the oldest job first, so every spinner is taken before any of the pass's jobs leave its thread.
//! **One hot pass at a time** in the process: a pass that starts while another is hot runs as a
//! plain `rayon::scope`. A worker waiting inside some other work (another engine's pass in the same
//! pool, as tests run them) may still pick up a spinner and resume only when the hot pass ends — a
//! delay, never a cycle, because the hot pass waits on nothing but its own jobs; two hot passes could
//! each hold the other's owner in a spinner, which the flag rules out. At most one spinner per core
//! besides the pass: with `--threads` above the core count the rest of the workers sleep as before
//! (spinners beyond the cores would take turns on a core with the pass itself).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Whether a hot pass is running (at most one at a time).
static HOT: AtomicBool = AtomicBool::new(false);

/// Raises the pass's flag when dropped (at `f`'s return or unwind) and frees [`HOT`].
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
        HOT.store(false, Ordering::Release);
    }
}

/// The cores this process may run on (affinity and cgroup quota): more spinners than that would take
/// turns on a core with the pass itself (`--threads` above the core count).
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `f` on a worker of the current rayon pool (the global one from outside it), the other
/// workers spinning for its parallel work until it returns (unless another hot pass is running: then
/// plainly, see the module doc).
pub(crate) fn hot<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        if HOT
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return f();
        }
        let owner = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads().min(cores()) {
            let done = &done;
            s.spawn(move |_| {
                if rayon::current_thread_index() == owner {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        let _done = Done(&done);
        f()
    })
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    use super::hot;

    #[test]
    fn runs_parallel_work_and_ends() {
        for threads in [1, 2, 4] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                for n in [0usize, 1, 7, 1000] {
                    let s: u64 = hot(|| (0..n as u64).into_par_iter().map(|i| i * i).sum());
                    assert_eq!(s, (0..n as u64).map(|i| i * i).sum::<u64>());
                    // nested joins inside
                    let v = hot(|| {
                        (0..64usize)
                            .into_par_iter()
                            .map(|i| (0..i).into_par_iter().sum::<usize>())
                            .collect::<Vec<_>>()
                    });
                    assert_eq!(v[63], 63 * 62 / 2);
                }
            });
        }
    }

    fn j_scale(k: u64) -> u64 {
        1 + k % 3
    }

    #[test]
    fn passes_from_several_threads_at_once_all_end() {
        // as tests run several engines over one pool: hot and plain passes interleave, nested joins
        // wait while spinners are about; every pass must end with its own result
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        std::thread::scope(|t| {
            for k in 0..4u64 {
                let pool = &pool;
                t.spawn(move || {
                    for i in 0..200u64 {
                        let n = 2000 * (j_scale(k) + i % 7);
                        let s = pool.install(|| {
                            hot(|| {
                                (0..32u64)
                                    .into_par_iter()
                                    .map(|j| (0..j + n).into_par_iter().map(|v| v % 13).sum::<u64>())
                                    .sum::<u64>()
                            })
                        });
                        let want: u64 = (0..32u64).map(|j| (0..j + n).map(|v| v % 13).sum::<u64>()).sum();
                        assert_eq!(s, want);
                    }
                });
            }
        });
    }

    #[test]
    fn a_panic_inside_still_ends_the_scope() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let r = pool.install(|| {
            std::panic::catch_unwind(|| {
                hot(|| {
                    let _: Vec<()> = (0..4).into_par_iter().map(|_| ()).collect();
                    panic!("inside the pass")
                })
            })
        });
        assert!(r.is_err());
        // the pool still works
        assert_eq!(pool.install(|| hot(|| (0..10u32).into_par_iter().sum::<u32>())), 45);
    }
}
