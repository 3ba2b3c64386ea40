//! Tests of the prefix cache on small real tensors. A position's keys encode the token and the
//! position (`token * 1000 + position`, values the negative), so a returned state can be checked
//! value by value against the tokens it claims to cover.

use candle_core::{Device, Tensor};

use super::*;

const LAYERS: usize = 2;
const HEADS: usize = 2;
const HEAD_DIM: usize = 3;
/// Bytes one position costs: keys and values of every layer, f32.
const POSITION_BYTES: u64 = (LAYERS * 2 * HEADS * HEAD_DIM * 4) as u64;

fn code(token: u32, position: usize) -> f32 {
    (token * 1000) as f32 + position as f32
}

/// Appends `tokens` at positions `state.len()..` to every layer.
fn extend(state: &mut KvState, tokens: &[u32]) {
    let start = state.len();
    let codes: Vec<f32> = tokens
        .iter()
        .enumerate()
        .flat_map(|(i, &t)| [code(t, start + i)].repeat(HEAD_DIM))
        .collect();
    let per_head = Tensor::from_vec(codes, (1, 1, tokens.len(), HEAD_DIM), &Device::Cpu).unwrap();
    let k = per_head.repeat((1, HEADS, 1, 1)).unwrap();
    let v = k.neg().unwrap();
    for layer in 0..LAYERS {
        state.append(layer, &k, &v).unwrap();
    }
}

fn state_of(tokens: &[u32]) -> KvState {
    let mut state = KvState::new(LAYERS);
    extend(&mut state, tokens);
    state
}

/// The tokens a state encodes, checked to agree across layers, heads, keys and values.
fn decode(state: &KvState) -> Vec<u32> {
    let mut tokens = None;
    for layer in 0..LAYERS {
        let (k, v) = state.layer(layer).unwrap();
        let keys: Vec<Vec<Vec<f32>>> = k.squeeze(0).unwrap().to_vec3().unwrap();
        let values: Vec<Vec<Vec<f32>>> = v.neg().unwrap().squeeze(0).unwrap().to_vec3().unwrap();
        assert_eq!(keys, values);
        for head in &keys {
            let decoded: Vec<u32> = head
                .iter()
                .enumerate()
                .map(|(pos, row)| {
                    assert!(row.iter().all(|&x| x == row[0]));
                    assert_eq!(row[0] as usize % 1000, pos, "position {pos} out of place");
                    row[0] as u32 / 1000
                })
                .collect();
            assert_eq!(*tokens.get_or_insert(decoded.clone()), decoded);
        }
    }
    tokens.unwrap_or_default()
}

/// Looks `tokens` up and checks the state covers exactly the reported match of `tokens`.
fn matched(cache: &mut PrefixCache, tokens: &[u32]) -> usize {
    let found = cache.lookup(tokens, 0);
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
fn a_branch_grown_from_a_cropped_state_leaves_stored_values_alone() {
    let mut cache = PrefixCache::new(16, 0);
    let a = [1, 2, 3, 4, 5];
    store(&mut cache, &a);
    let (mut b, len) = cache.lookup(&[1, 2, 3, 8, 8, 8], 0).unwrap();
    assert_eq!(len, 3);
    extend(&mut b, &[8, 8]);
    assert_eq!(decode(&b), [1, 2, 3, 8, 8]);
    cache.store(&[1, 2, 3, 8, 8], b);
    check(&cache);
    let (again, len) = cache.lookup(&[1, 2, 3, 4, 5, 6], 0).unwrap();
    assert_eq!(len, 5);
    assert_eq!(decode(&again), a);
    // And the other way: growing what a lookup returned does not reach back into the cache.
    let (mut grown, _) = cache.lookup(&[1, 2, 3, 4, 5, 6], 0).unwrap();
    extend(&mut grown, &[6, 6, 6]);
    assert_eq!(matched(&mut cache, &[1, 2, 3, 4, 5, 6, 6]), 5);
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
