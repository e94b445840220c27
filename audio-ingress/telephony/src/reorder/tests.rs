//! Reorder window tests: explicit Instants, seeded shuffles and delays.

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The stream starts at its first chunk pushed (the property tests start anywhere).
fn cfg() -> ReorderConfig {
    ReorderConfig {
        first: None,
        ..ReorderConfig::default()
    }
}

/// Deterministic xorshift64*, so the property tests need no new crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Pops everything ready at `now`.
fn drain(r: &mut Reorder<u64>, now: Instant, outs: &mut Vec<Out<u64>>) {
    // Bounded: each pop releases at least one chunk number of at most max_jump + 1 held.
    for _ in 0..1000 {
        match r.pop(now) {
            Some(out) => outs.push(out),
            None => return,
        }
    }
    panic!("pop never returned None");
}

/// Checks order and that numbers `first..=last` are each covered exactly once;
/// returns (chunks, gap chunks). A chunk's item must be its number.
fn account(outs: &[Out<u64>], first: u64, last: u64) -> (u64, u64) {
    let mut expect = first;
    let (mut chunks, mut gap_chunks) = (0, 0);
    for out in outs {
        match out {
            Out::Chunk { chunk, item } => {
                assert_eq!(*chunk, expect, "out of order or duplicated: {outs:?}");
                assert_eq!(item, chunk);
                expect += 1;
                chunks += 1;
            }
            Out::Gap { first, chunks: n } => {
                assert_eq!(*first, expect, "gap out of order: {outs:?}");
                assert!(*n >= 1);
                expect += n;
                gap_chunks += n;
            }
        }
    }
    assert_eq!(expect, last + 1, "numbers not all accounted for");
    (chunks, gap_chunks)
}

#[test]
fn in_order_chunks_pass_straight_through() {
    let t0 = Instant::now();
    let mut r = Reorder::new(cfg());
    let mut outs = Vec::new();
    for c in 1..=100u64 {
        assert_eq!(r.push(c, c, t0 + ms(c * 20)), Ok(Pushed::Held));
        drain(&mut r, t0 + ms(c * 20), &mut outs);
        assert_eq!(r.held(), 0);
    }
    assert_eq!(account(&outs, 1, 100), (100, 0));
    assert_eq!(r.stats(), ReorderStats::default());
    assert_eq!(r.deadline(), None);
}

#[test]
fn shuffles_within_the_window_come_out_in_order_without_gaps() {
    let mut rng = Rng(0x0031_5eed);
    for window in [1u64, 2, 3, 5, 8] {
        for _trial in 0..40 {
            let n = 200u64;
            let first = 1 + rng.below(1000);
            // Arrival order: chunk i at key 2i + U[0, 2 window): a chunk can
            // only be overtaken by chunks at most `window - 1` ahead of it.
            let mut order: Vec<(u64, u64)> = (0..n)
                .map(|i| (2 * i + rng.below(2 * window), first + i))
                .collect();
            order.sort();
            let t0 = Instant::now();
            let mut r = Reorder::new(ReorderConfig { window, ..cfg() });
            let mut outs = Vec::new();
            // The first arrival sets the start: make it the first chunk.
            let start = order.iter().position(|&(_, c)| c == first).unwrap();
            let head = order.remove(start);
            order.insert(0, head);
            for &(_, c) in &order {
                assert_eq!(r.push(c, c, t0), Ok(Pushed::Held));
                drain(&mut r, t0, &mut outs);
            }
            assert_eq!(account(&outs, first, first + n - 1), (n, 0));
            assert_eq!(r.held(), 0);
            assert_eq!(r.stats().gaps, 0);
            assert_eq!(r.stats().late, 0);
            if window > 1 {
                assert!(r.stats().reordered > 0);
            }
        }
    }
}

#[test]
fn delays_beyond_the_window_become_gaps_never_disorder() {
    let mut rng = Rng(0xdead_0031);
    for _trial in 0..50 {
        let n = 300u64;
        let c = cfg();
        let mut r = Reorder::new(c.clone());
        // Chunk i is sent at i*20 ms; 8% never arrive, 8% arrive 5..12 chunks late,
        // the rest with a jitter of up to 2 chunks.
        let mut arrivals: Vec<(u64, u64)> = Vec::new(); // (arrival ms, chunk)
        let mut lost = 0;
        for i in 1..=n {
            let roll = rng.below(100);
            let delay = match roll {
                0..=7 if i > 1 => {
                    lost += 1;
                    continue;
                }
                8..=15 if i > 1 => 20 * (5 + rng.below(8)),
                _ if i > 1 => rng.below(40),
                _ => 0,
            };
            arrivals.push((i * 20 + delay, i));
        }
        arrivals.sort();
        let t0 = Instant::now();
        let mut outs = Vec::new();
        let mut late = 0;
        for &(at, chunk) in &arrivals {
            let now = t0 + ms(at);
            // Time passes between arrivals: what timed out is released first.
            drain(&mut r, now, &mut outs);
            match r.push(chunk, chunk, now).unwrap() {
                Pushed::Held => {}
                Pushed::Late => late += 1,
            }
            drain(&mut r, now, &mut outs);
        }
        outs.extend(r.finish());
        let highest = arrivals.iter().map(|&(_, c)| c).max().unwrap();
        let (chunks, gap_chunks) = account(&outs, 1, highest);
        assert_eq!(chunks + gap_chunks, highest);
        assert_eq!(chunks + late, arrivals.len() as u64);
        assert!(gap_chunks >= lost.min(highest) - (n - highest));
        let s = r.stats();
        assert_eq!(s.late, late);
        assert_eq!(s.gap_chunks, gap_chunks);
        assert!(s.gaps > 0 && late > 0, "{s:?}");
    }
}

#[test]
fn window_declares_only_the_chunks_it_gave_up_on() {
    let t0 = Instant::now();
    let mut r = Reorder::new(cfg()); // window 3
    let mut outs = Vec::new();
    r.push(1, 1, t0).unwrap();
    r.push(4, 4, t0).unwrap(); // 2 and 3 missing; 4 is 2 ahead of 2
    drain(&mut r, t0, &mut outs);
    assert_eq!(outs, vec![Out::Chunk { chunk: 1, item: 1 }]);
    r.push(5, 5, t0).unwrap(); // 5 is 3 ahead of 2: 2 gives up, 3 still waits
    drain(&mut r, t0, &mut outs);
    assert_eq!(
        outs[1..],
        [Out::Gap {
            first: 2,
            chunks: 1
        }]
    );
    r.push(3, 3, t0).unwrap(); // in time
    drain(&mut r, t0, &mut outs);
    assert_eq!(
        outs[2..],
        [
            Out::Chunk { chunk: 3, item: 3 },
            Out::Chunk { chunk: 4, item: 4 },
            Out::Chunk { chunk: 5, item: 5 }
        ]
    );
    assert_eq!(r.push(2, 2, t0), Ok(Pushed::Late));
    let s = r.stats();
    assert_eq!((s.gaps, s.gap_chunks, s.late, s.reordered), (1, 1, 1, 1));
}

#[test]
fn hold_declares_a_gap_at_the_deadline() {
    let t0 = Instant::now();
    let mut r = Reorder::new(cfg()); // hold 60 ms
    let mut outs = Vec::new();
    assert_eq!(r.deadline(), None);
    r.push(1, 1, t0).unwrap();
    assert_eq!(r.deadline(), Some(t0)); // releasable now
    drain(&mut r, t0, &mut outs);
    r.push(3, 3, t0 + ms(20)).unwrap();
    r.push(4, 4, t0 + ms(40)).unwrap();
    drain(&mut r, t0 + ms(40), &mut outs);
    assert_eq!(outs.len(), 1);
    // The oldest held chunk (3) arrived at 20 ms: it waits until 80 ms.
    assert_eq!(r.deadline(), Some(t0 + ms(80)));
    assert_eq!(r.pop(t0 + ms(79)), None);
    drain(&mut r, t0 + ms(80), &mut outs);
    assert_eq!(
        outs[1..],
        [
            Out::Gap {
                first: 2,
                chunks: 1
            },
            Out::Chunk { chunk: 3, item: 3 },
            Out::Chunk { chunk: 4, item: 4 }
        ]
    );
    assert_eq!(r.deadline(), None);
}

#[test]
fn refusals_repeat_backwards_jump() {
    let t0 = Instant::now();
    let mut r = Reorder::new(cfg()); // history 64, max_jump 250
    let mut outs = Vec::new();
    for c in 100..=199u64 {
        r.push(c, c, t0).unwrap();
    }
    drain(&mut r, t0, &mut outs);
    // next = 200.
    let e = r.push(199, 0, t0).unwrap_err();
    assert_eq!(
        (e.clone(), e.code()),
        (ReorderError::Repeat { chunk: 199 }, "sequence_repeat")
    );
    assert_eq!(r.push(136, 0, t0), Err(ReorderError::Repeat { chunk: 136 }));
    let e = r.push(135, 0, t0).unwrap_err();
    assert_eq!(
        e,
        ReorderError::Backwards {
            chunk: 135,
            next: 200
        }
    );
    assert_eq!(e.code(), "sequence_backwards");
    r.push(202, 202, t0).unwrap();
    assert_eq!(r.push(202, 0, t0), Err(ReorderError::Repeat { chunk: 202 }));
    let e = r.push(451, 0, t0).unwrap_err();
    assert_eq!(
        e,
        ReorderError::Jump {
            chunk: 451,
            next: 200
        }
    );
    assert_eq!(e.code(), "sequence_jump");
    assert_eq!(r.push(450, 450, t0), Ok(Pushed::Held));
    assert_eq!(
        r.push(u64::MAX, 0, t0),
        Err(ReorderError::Jump {
            chunk: u64::MAX,
            next: 200
        })
    );
    // Refusals changed nothing: 200 is still awaited, 202 and 450 held.
    assert_eq!(r.next_chunk(), Some(200));
    assert_eq!(r.held(), 2);
    assert_eq!(r.stats().late, 0);
}

#[test]
fn a_chunk_before_the_first_one_is_late() {
    let t0 = Instant::now();
    let mut r = Reorder::new(cfg());
    r.push(5, 5, t0).unwrap();
    assert_eq!(r.push(3, 3, t0), Ok(Pushed::Late));
    assert_eq!(r.pop(t0), Some(Out::Chunk { chunk: 5, item: 5 }));
    assert_eq!(r.push(4, 4, t0), Ok(Pushed::Late));
    assert_eq!(r.stats().late, 2);
}

#[test]
fn finish_drains_everything_with_gaps_between() {
    let t0 = Instant::now();
    let mut r = Reorder::new(cfg());
    assert_eq!(r.finish().count(), 0);
    for c in [1u64, 3, 6] {
        r.push(c, c, t0).unwrap();
    }
    let drained = r.finish();
    assert_eq!(r.held(), 0); // the iterator does not borrow the window
    let outs: Vec<_> = drained.collect();
    assert_eq!(
        outs,
        vec![
            Out::Chunk { chunk: 1, item: 1 },
            Out::Gap {
                first: 2,
                chunks: 1
            },
            Out::Chunk { chunk: 3, item: 3 },
            Out::Gap {
                first: 4,
                chunks: 2
            },
            Out::Chunk { chunk: 6, item: 6 },
        ]
    );
    assert_eq!(r.held(), 0);
    assert_eq!(r.pop(t0 + Duration::from_secs(1)), None);
    assert_eq!(r.deadline(), None);
    assert_eq!(r.next_chunk(), Some(7));
    assert_eq!(r.push(6, 6, t0), Err(ReorderError::Repeat { chunk: 6 }));
    assert_eq!(r.push(5, 5, t0), Ok(Pushed::Late));
    let s = r.stats();
    assert_eq!((s.gaps, s.gap_chunks), (2, 3));
}

/// Both carriers number chunks from 1: a first chunk 2 waits for chunk 1 (the very
/// first chunks may be reordered too); a stream that starts elsewhere starts there.
#[test]
fn the_first_chunks_may_be_reordered_and_other_starts_are_taken_as_they_come() {
    let t0 = Instant::now();
    let mut r = Reorder::new(ReorderConfig::default());
    assert_eq!(r.push(2, 'b', t0), Ok(Pushed::Held));
    assert_eq!(r.pop(t0), None, "chunk 1 is awaited");
    assert_eq!(r.push(1, 'a', t0), Ok(Pushed::Held));
    assert_eq!(
        r.pop(t0),
        Some(Out::Chunk {
            chunk: 1,
            item: 'a'
        })
    );
    assert_eq!(
        r.pop(t0),
        Some(Out::Chunk {
            chunk: 2,
            item: 'b'
        })
    );
    // Chunk 1 never comes: declared once the hold ran out.
    let mut r = Reorder::new(ReorderConfig::default());
    assert_eq!(r.push(3, 'c', t0), Ok(Pushed::Held));
    let later = t0 + ReorderConfig::default().hold;
    assert_eq!(
        r.pop(later),
        Some(Out::Gap {
            first: 1,
            chunks: 2
        })
    );
    assert_eq!(
        r.pop(later),
        Some(Out::Chunk {
            chunk: 3,
            item: 'c'
        })
    );
    // Far from 1 (or below it): the stream starts at its first chunk.
    for first in [0, 100] {
        let mut r = Reorder::new(ReorderConfig::default());
        assert_eq!(r.push(first, 'x', t0), Ok(Pushed::Held));
        assert_eq!(
            r.pop(t0),
            Some(Out::Chunk {
                chunk: first,
                item: 'x'
            })
        );
    }
}
