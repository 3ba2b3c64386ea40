//! Tests of the tree with a segment that records the token and position of each entry, so a
//! returned state can be checked entry by entry against the tokens it claims to cover. The
//! backends test their own segment types (candle: `kv.rs`).

use super::*;

/// Bytes one position costs, as a backend with 2 layers, 2 heads of 3 f32 would count them.
const POSITION_BYTES: u64 = 2 * 2 * 2 * 3 * 4;

/// `(token, position)` per position held.
#[derive(Debug, Clone, Default)]
struct Trace(Vec<(u32, usize)>);

impl Segment for Trace {
    fn empty() -> Self {
        Trace::default()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn bytes(&self) -> u64 {
        self.0.len() as u64 * POSITION_BYTES
    }

    fn slice(&self, start: usize, len: usize) -> Option<Self> {
        self.0.get(start..start + len).map(|s| Trace(s.to_vec()))
    }

    fn prefix(&self, len: usize) -> Option<Self> {
        self.slice(0, len)
    }

    fn concat(parts: &[Self]) -> Option<Self> {
        Some(Trace(parts.iter().flat_map(|p| p.0.clone()).collect()))
    }
}

type PrefixCache = super::PrefixCache<Trace>;

/// Appends `tokens` at positions `state.len()..`.
fn extend(state: &mut Trace, tokens: &[u32]) {
    let start = state.len();
    state
        .0
        .extend(tokens.iter().enumerate().map(|(i, &t)| (t, start + i)));
}

fn state_of(tokens: &[u32]) -> Trace {
    let mut state = Trace::default();
    extend(&mut state, tokens);
    state
}

/// The tokens a state holds, each checked to sit at its own position.
fn decode(state: &Trace) -> Vec<u32> {
    state
        .0
        .iter()
        .enumerate()
        .map(|(pos, &(token, at))| {
            assert_eq!(at, pos, "position {pos} out of place");
            token
        })
        .collect()
}

/// Looks `tokens` up and checks the state covers exactly the reported match of `tokens`, which
/// a peek foretold.
fn matched(cache: &mut PrefixCache, tokens: &[u32]) -> usize {
    let peeked = cache.peek(tokens);
    let before = cache.stats();
    assert_eq!(cache.peek(tokens), peeked);
    assert_eq!(cache.stats(), before, "a peek counts nothing");
    let found = cache.lookup(tokens, 0);
    assert_eq!(found.as_ref().map_or(0, |(_, n)| *n), peeked);
    check(cache);
    match found {
        None => 0,
        Some((state, len)) => {
            assert_eq!(state.len(), len);
            assert_eq!(decode(&state), tokens[..len]);
            len
        }
    }
}

fn store(cache: &mut PrefixCache, tokens: &[u32]) {
    cache.store(tokens, state_of(tokens));
    check(cache);
}

/// The tree's invariants: links agree both ways, segments match their edges, the leaf index is
/// exactly the childless non-root nodes, parents are used no earlier than their children, and
/// the byte count is the sum of the segments.
fn check(cache: &PrefixCache) {
    let mut bytes = 0;
    let mut leaves = BTreeSet::new();
    for (id, node) in cache.nodes.iter().enumerate() {
        let Some(node) = node else { continue };
        if id == ROOT {
            assert!(node.edge.is_empty());
        } else {
            assert!(!node.edge.is_empty());
            assert_eq!(node.kv.len(), node.edge.len());
            let parent = cache.node(node.parent);
            assert_eq!(parent.children.get(&node.edge[0]), Some(&id));
            assert!(node.parent == ROOT || parent.stamp >= node.stamp);
            if node.children.is_empty() {
                leaves.insert((node.stamp, id));
            }
        }
        for (&first, &child) in &node.children {
            assert_eq!(cache.node(child).edge[0], first);
            assert_eq!(cache.node(child).parent, id);
        }
        bytes += node.kv.bytes();
    }
    assert_eq!(leaves, cache.leaves);
    assert_eq!(bytes, cache.bytes);
}

#[test]
fn finds_the_longest_common_prefix_across_branching_entries() {
    let mut cache = PrefixCache::new(16, 0);
    store(&mut cache, &[1, 2, 3, 4, 5]);
    store(&mut cache, &[1, 2, 7, 8]);
    store(&mut cache, &[9, 9]);
    let cases: &[(&[u32], usize)] = &[
        (&[1, 2, 3, 9, 9], 3),       // diverges inside the first entry's own edge
        (&[1, 2, 7, 8, 9, 10], 4),   // extends the second entry
        (&[1, 2, 7, 9], 3),          // diverges inside the second entry
        (&[1, 2, 5, 5], 2),          // diverges at the branch point
        (&[1, 2, 3, 4, 5, 6, 7], 5), // extends the first entry
        (&[9, 9, 9], 2),             // a one-edge entry
        (&[5, 1, 2, 3], 0),          // shares nothing
    ];
    for (tokens, expected) in cases {
        assert_eq!(matched(&mut cache, tokens), *expected, "lookup {tokens:?}");
    }
}

#[test]
fn caps_the_match_one_token_short_of_the_prompt() {
    let mut cache = PrefixCache::new(16, 0);
    store(&mut cache, &[1, 2, 3]);
    assert_eq!(matched(&mut cache, &[1, 2, 3]), 2);
    assert_eq!(matched(&mut cache, &[1, 2]), 1);
    assert_eq!(matched(&mut cache, &[1]), 0);
    assert_eq!(matched(&mut cache, &[]), 0);
}

#[test]
fn counts_hits_misses_and_reused_tokens() {
    let mut cache = PrefixCache::new(16, 0);
    assert_eq!(matched(&mut cache, &[1, 2, 3]), 0);
    store(&mut cache, &[1, 2, 3]);
    assert_eq!(matched(&mut cache, &[1, 2, 3, 4]), 3);
    assert_eq!(matched(&mut cache, &[1, 2, 9]), 2);
    assert_eq!(matched(&mut cache, &[4]), 0);
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.reused_tokens), (2, 2, 5));
    assert_eq!((stats.entries, stats.evictions), (1, 0));
    assert_eq!(stats.bytes, 3 * POSITION_BYTES);
}

#[test]
fn holds_shared_prefixes_once() {
    let mut cache = PrefixCache::new(16, 0);
    store(&mut cache, &[1, 2, 3]);
    store(&mut cache, &[1, 2, 3, 4, 5]); // extends: only 4, 5 are new
    assert_eq!(
        (cache.stats().entries, cache.stats().bytes),
        (1, 5 * POSITION_BYTES)
    );
    store(&mut cache, &[1, 2]); // a prefix: nothing new
    assert_eq!(
        (cache.stats().entries, cache.stats().bytes),
        (1, 5 * POSITION_BYTES)
    );
    store(&mut cache, &[1, 2, 3, 6]); // a branch: only 6 is new
    assert_eq!(
        (cache.stats().entries, cache.stats().bytes),
        (2, 6 * POSITION_BYTES)
    );
    assert_eq!(matched(&mut cache, &[1, 2, 3, 4, 5, 0]), 5);
    assert_eq!(matched(&mut cache, &[1, 2, 3, 6, 0]), 4);
}

#[test]
fn evicts_the_least_recently_used_entry() {
    let mut cache = PrefixCache::new(2, 0);
    store(&mut cache, &[1, 1, 1]);
    store(&mut cache, &[2, 2, 2]);
    assert_eq!(matched(&mut cache, &[1, 1, 1, 0]), 3); // 1s are now newer than 2s
    store(&mut cache, &[3, 3, 3]);
    assert_eq!(matched(&mut cache, &[2, 2, 2, 0]), 0);
    assert_eq!(matched(&mut cache, &[3, 3, 3, 0]), 3);
    assert_eq!(matched(&mut cache, &[1, 1, 1, 0]), 3);
    store(&mut cache, &[4, 4]); // 3s were last used before 1s
    assert_eq!(matched(&mut cache, &[3, 3, 3, 0]), 0);
    assert_eq!(matched(&mut cache, &[1, 1, 1, 0]), 3);
    assert_eq!((cache.stats().entries, cache.stats().evictions), (2, 2));
}

#[test]
fn eviction_keeps_a_prefix_other_entries_share() {
    let mut cache = PrefixCache::new(1, 0);
    store(&mut cache, &[1, 2, 3, 4]);
    store(&mut cache, &[1, 2, 5, 6]);
    assert_eq!(cache.stats().entries, 1);
    assert_eq!(cache.stats().bytes, 4 * POSITION_BYTES);
    assert_eq!(matched(&mut cache, &[1, 2, 3, 4, 0]), 2);
    assert_eq!(matched(&mut cache, &[1, 2, 5, 6, 0]), 4);
    store(&mut cache, &[1, 2, 3, 4]); // and the tree takes the evicted branch back
    assert_eq!(matched(&mut cache, &[1, 2, 3, 4, 0]), 4);
}

#[test]
fn a_recently_used_prefix_outlives_its_older_branches() {
    let mut cache = PrefixCache::new(2, 0);
    store(&mut cache, &[1, 2, 3]);
    store(&mut cache, &[1, 2, 4]);
    store(&mut cache, &[7, 7]); // drops the oldest leaf, [3]
    assert_eq!(matched(&mut cache, &[1, 2, 9]), 2); // uses only the shared [1, 2]
                                                    // [4] is the oldest leaf; once it goes, [1, 2] is a leaf newer than [7, 7], which goes next.
    store(&mut cache, &[8, 8]);
    assert_eq!(matched(&mut cache, &[1, 2, 3, 0]), 2);
    assert_eq!(matched(&mut cache, &[1, 2, 4, 0]), 2);
    assert_eq!(matched(&mut cache, &[7, 7, 0]), 0);
    assert_eq!(matched(&mut cache, &[8, 8, 0]), 2);
    assert_eq!(cache.stats().evictions, 3);
}

#[test]
fn evicts_to_stay_within_the_byte_budget() {
    let mut cache = PrefixCache::new(100, 6 * POSITION_BYTES);
    store(&mut cache, &[1, 1, 1]);
    store(&mut cache, &[2, 2, 2]);
    assert_eq!(cache.stats().evictions, 0);
    store(&mut cache, &[3, 3]);
    let stats = cache.stats();
    assert_eq!((stats.evictions, stats.entries), (1, 2));
    assert_eq!(stats.bytes, 5 * POSITION_BYTES);
    assert_eq!(matched(&mut cache, &[1, 1, 1, 0]), 0);
    store(&mut cache, &[4; 7]); // larger than the whole budget: kept by nothing
    assert!(cache.stats().bytes <= 6 * POSITION_BYTES);
    assert_eq!(matched(&mut cache, &[4; 8]), 0);
}

#[test]
fn reset_drops_entries_and_counters() {
    let mut cache = PrefixCache::new(1, 0);
    store(&mut cache, &[1, 2, 3]);
    store(&mut cache, &[4, 5, 6]);
    matched(&mut cache, &[4, 5, 6, 7]);
    matched(&mut cache, &[8]);
    cache.reset();
    check(&cache);
    assert_eq!(cache.stats(), PrefixCacheStats::default());
    assert_eq!(matched(&mut cache, &[4, 5, 6, 7]), 0);
    store(&mut cache, &[4, 5, 6]);
    assert_eq!(matched(&mut cache, &[4, 5, 6, 7]), 3);
}

#[test]
fn agrees_with_a_scan_of_all_stored_sequences() {
    // Data-driven: pseudo-random sequences over a small alphabet branch often and deep.
    let mut seed = 0x2545_f491_u32;
    let mut next = |n: u32| {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed % n
    };
    let mut cache = PrefixCache::new(1000, 0);
    let mut stored: Vec<Vec<u32>> = Vec::new();
    for _ in 0..200 {
        let len = 1 + next(12) as usize;
        let tokens: Vec<u32> = (0..len).map(|_| 1 + next(3)).collect();
        let cap = tokens.len() - 1;
        let expected = stored
            .iter()
            .map(|s| common_prefix(s, &tokens).min(cap))
            .max()
            .unwrap_or(0);
        assert_eq!(matched(&mut cache, &tokens), expected, "lookup {tokens:?}");
        if next(2) == 0 {
            store(&mut cache, &tokens);
            stored.push(tokens);
        }
    }
    let stats = cache.stats();
    assert!(stats.hits > 0 && stats.misses > 0);
}

/// A backend's counts: every call's tokens, a hit or a miss per call only with the cache on,
/// and afresh after a reset.
#[test]
fn token_counts_add_calls_and_count_hits_only_with_the_cache_on() {
    let counts = TokenCounts::default();
    counts.add(false, 10, 0, 3);
    counts.add(true, 12, 8, 0);
    counts.add(true, 5, 0, 2);
    let stats = counts.get();
    assert_eq!(
        (
            stats.prompt_tokens,
            stats.generated_tokens,
            stats.kv_cache_reused_tokens
        ),
        (27, 5, 8)
    );
    assert_eq!((stats.kv_cache_hits, stats.kv_cache_misses), (1, 1));
    counts.reset();
    assert_eq!(counts.get(), BackendStats::default());
}
