//! Prompt-prefix KV cache: a radix tree of token sequences whose edges own their KV segments.
//! Generic over the backend's state type ([`Segment`]): candle keeps tensors, onnx plain
//! buffers, and both share this tree.
//!
//! `lmhost explain` sends hundreds of prompts that are one conversation with parts removed;
//! prompts that keep the same leading parts share a token prefix. Computing that prefix once and
//! reusing its keys and values is the biggest speed lever of the product (issue 4, after the
//! reference backend's `_attach_prefix_cache`).
//!
//! Design:
//! - **Radix tree, KV on the edges.** Each node holds an edge label (tokens) and the KV state of
//!   exactly those positions. A stored sequence is the path from the root to a node; its state is
//!   the concatenation of the segments on that path. So a prefix shared by many stored prompts is
//!   held once, a sequence that extends a stored one adds only its new positions, and a sequence
//!   that is a prefix of a stored one adds nothing. Bytes held are the bytes of distinct prefixes.
//! - **Lookup** walks the prompt down the tree (one hash probe per edge, one comparison per
//!   token), so it costs O(prompt length) whatever the number of entries, and finds the longest
//!   common prefix with *any* stored sequence, including one that diverges mid-edge. The state
//!   it returns is a fresh concatenation (or a view of one segment): the caller may append to
//!   it, and nothing stored can change (a [`Segment`] promises that). A batched caller says how much it
//!   can already take from an earlier prompt of its batch; the counters record what was reused
//!   from either, so they match the records' `cached_prompt_tokens`.
//! - **Entries are leaves.** Eviction is least-recently-used over leaves with a monotonic clock
//!   (as SGLang's RadixAttention does): a lookup or store stamps every node on its path, and a
//!   leaf is dropped only with its own segment, so a prefix still shared by other leaves stays.
//!   A parent whose last child goes becomes a leaf with its own (newer) stamp.
//! - Failures inside the cache (a tensor op that errors) are never fatal: a lookup that cannot
//!   assemble its state is a miss, a store that cannot copy its segment stores nothing.

use std::collections::{BTreeSet, HashMap};

use std::sync::Mutex;

use lmhost_plugin_api::{
    lock_or_reset, BackendStats, GenerationRecord, KvCacheSettings, ScoreRecord,
};

/// The computed state (keys and values of every layer) of consecutive positions, as a backend
/// holds it. A segment is a snapshot: growing a clone or a prefix of it never changes it.
pub trait Segment: Clone + Send {
    /// A state of no positions.
    fn empty() -> Self;
    /// Positions held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes the held positions take.
    fn bytes(&self) -> u64;
    /// Positions `start..start + len` in memory of their own, so a stored segment never keeps
    /// a larger buffer it was cut from alive; `None` when that cannot be made.
    fn slice(&self, start: usize, len: usize) -> Option<Self>;
    /// The first `len` positions (a view where the type can share memory).
    fn prefix(&self, len: usize) -> Option<Self>;
    /// The positions of `parts`, one after the other.
    fn concat(parts: &[Self]) -> Option<Self>;
}

/// Where prefix states are kept between calls: an engine asks through this, [`PrefixCache`]
/// is one, and a test may bring another.
pub trait PrefixStore<S>: Send {
    /// The longest stored prefix of `tokens` (at most `tokens.len() - 1`), cropped to it, if it
    /// is longer than `shared`: the positions the caller can already take from an earlier
    /// prompt of its batch. Counts one lookup that reused the longer of the two.
    fn lookup(&mut self, tokens: &[u32], shared: usize) -> Option<(S, usize)>;
    fn store(&mut self, tokens: &[u32], state: S);
    /// How many tokens [`PrefixStore::lookup`] would reuse now, without counting or touching
    /// anything: what a batching caller plans with.
    fn peek(&self, _tokens: &[u32]) -> usize {
        0
    }
}

/// Counters and sizes of a [`PrefixCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Lookups that reused at least one token.
    pub hits: u64,
    /// Lookups that reused nothing.
    pub misses: u64,
    /// Tokens served from the cache, summed over hits.
    pub reused_tokens: u64,
    /// Tree leaves (cached segments) dropped to stay within `max_entries` / `max_bytes`.
    pub evictions: u64,
    /// Bytes of KV state held (each distinct prefix position counted once).
    pub bytes: u64,
    /// Distinct maximal sequences held (leaves of the tree).
    pub entries: u64,
}

impl PrefixCacheStats {
    /// A backend's own token counts with these counters over their cache fields (a test can
    /// hold the cache's counters against the records).
    pub fn over(self, counted: BackendStats) -> BackendStats {
        BackendStats {
            kv_cache_hits: self.hits,
            kv_cache_misses: self.misses,
            kv_cache_reused_tokens: self.reused_tokens,
            kv_cache_evictions: self.evictions,
            kv_cache_bytes: self.bytes,
            ..counted
        }
    }
}

/// A backend's prefix cache as its calls share it: on or off as `[kv_cache]` says, held by one
/// call at a time, and its counters readable without waiting for that call (a server's
/// `/metrics` asks while requests run).
pub struct SharedCache<S> {
    cache: Mutex<Option<PrefixCache<S>>>,
    /// The counters as of the last call that used the cache (`None`: the cache is off).
    published: Mutex<Option<PrefixCacheStats>>,
}

impl<S> Default for SharedCache<S> {
    fn default() -> Self {
        SharedCache {
            cache: Mutex::new(None),
            published: Mutex::new(None),
        }
    }
}

impl<S: Segment> SharedCache<S> {
    /// Turns the cache on afresh (empty) or off.
    pub fn set(&self, settings: KvCacheSettings) {
        let mut cache = self.lock();
        *cache = settings.enabled.then(|| {
            let max_entries = usize::try_from(settings.max_entries).unwrap_or(usize::MAX);
            PrefixCache::new(max_entries, settings.max_bytes)
        });
        self.publish(&cache);
    }

    /// Runs `f` with the store, if the cache is on. The cache is held for the call, so cached
    /// calls run one at a time; uncached calls run concurrently.
    pub fn with_store<T>(&self, f: impl FnOnce(Option<&mut dyn PrefixStore<S>>) -> T) -> T {
        let mut cache = self.lock();
        match cache.as_mut() {
            Some(store) => {
                let out = f(Some(store));
                self.publish(&cache);
                out
            }
            None => {
                drop(cache);
                f(None)
            }
        }
    }

    /// The counters the last call left; `None` when the cache is off.
    pub fn stats(&self) -> Option<PrefixCacheStats> {
        *lock_or_reset(&self.published, |_| {})
    }

    /// The cache. A call that panicked while holding it may have left it half-updated, so it
    /// is emptied then: the backend stays usable.
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<PrefixCache<S>>> {
        lock_or_reset(&self.cache, |cache| {
            if let Some(cache) = cache {
                cache.reset();
            }
        })
    }

    fn publish(&self, cache: &Option<PrefixCache<S>>) {
        *lock_or_reset(&self.published, |_| {}) = cache.as_ref().map(PrefixCache::stats);
    }
}

/// A backend's token counts over its life, which every call adds to: prompt, generated and
/// reused tokens, and with the cache on a hit for each call that reused prompt tokens and a
/// miss for each that reused none. Read without waiting for a running call.
#[derive(Debug, Default)]
pub struct TokenCounts(Mutex<BackendStats>);

impl TokenCounts {
    /// Adds one call's tokens; `caching`: whether the prefix cache is on.
    pub fn add(&self, caching: bool, prompt: u32, cached: u32, generated: usize) {
        let mut stats = lock_or_reset(&self.0, |_| {});
        stats.prompt_tokens += u64::from(prompt);
        stats.generated_tokens += generated as u64;
        stats.kv_cache_reused_tokens += u64::from(cached);
        stats.kv_cache_hits += u64::from(caching && cached > 0);
        stats.kv_cache_misses += u64::from(caching && cached == 0);
    }

    /// Adds a generation's tokens.
    pub fn add_generation(&self, caching: bool, record: &GenerationRecord) {
        let generated = record.token_ids.len();
        self.add(
            caching,
            record.prompt_tokens,
            record.cached_prompt_tokens,
            generated,
        );
    }

    /// Adds scored prompts' tokens.
    pub fn add_scores(&self, caching: bool, records: &[ScoreRecord]) {
        for record in records {
            self.add(
                caching,
                record.prompt_tokens,
                record.cached_prompt_tokens,
                0,
            );
        }
    }

    /// Starts the counts afresh (a backend's `set_kv_cache` does).
    pub fn reset(&self) {
        *lock_or_reset(&self.0, |_| {}) = BackendStats::default();
    }

    /// The counts so far.
    pub fn get(&self) -> BackendStats {
        *lock_or_reset(&self.0, |_| {})
    }

    /// The counts so far, with `cache`'s own counters over them where it is on.
    pub fn stats<S: Segment>(&self, cache: &SharedCache<S>) -> BackendStats {
        let counted = self.get();
        match cache.stats() {
            Some(cached) => cached.over(counted),
            None => counted,
        }
    }
}

type NodeId = usize;
const ROOT: NodeId = 0;

/// One edge of the radix tree and the node it leads to.
#[derive(Debug)]
struct Node<S> {
    parent: NodeId,
    /// Tokens of the edge from `parent`; empty only for the root.
    edge: Vec<u32>,
    /// KV state of exactly the positions of `edge`.
    kv: S,
    /// Children keyed by the first token of their edge.
    children: HashMap<u32, NodeId>,
    /// Clock value of the last lookup or store whose path reached this node.
    stamp: u64,
}

/// A token-keyed store of KV snapshots with longest-common-prefix lookup and LRU eviction.
#[derive(Debug)]
pub struct PrefixCache<S> {
    /// Arena of nodes; `None` marks a free slot listed in `free`.
    nodes: Vec<Option<Node<S>>>,
    free: Vec<NodeId>,
    /// Leaves ordered by last use, oldest first.
    leaves: BTreeSet<(u64, NodeId)>,
    clock: u64,
    max_entries: usize,
    max_bytes: u64,
    bytes: u64,
    hits: u64,
    misses: u64,
    reused_tokens: u64,
    evictions: u64,
}

impl<S: Segment> PrefixCache<S> {
    /// A cache holding at most `max_entries` leaves and `max_bytes` bytes (0: no byte budget).
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        PrefixCache {
            nodes: vec![Some(Node {
                parent: ROOT,
                edge: Vec::new(),
                kv: S::empty(),
                children: HashMap::new(),
                stamp: 0,
            })],
            free: Vec::new(),
            leaves: BTreeSet::new(),
            clock: 0,
            max_entries,
            max_bytes,
            bytes: 0,
            hits: 0,
            misses: 0,
            reused_tokens: 0,
            evictions: 0,
        }
    }

    /// Longest common prefix between `tokens` and any stored sequence, capped at
    /// `tokens.len() - 1` so at least one token is left to compute logits from. Returns that
    /// prefix's state (the caller owns it) and its length when it is longer than `shared`, the
    /// positions the caller can take from elsewhere (an earlier prompt of its batch). Counts a
    /// hit reusing the longer of the two, or a miss when both are 0.
    pub fn lookup(&mut self, tokens: &[u32], shared: usize) -> Option<(S, usize)> {
        let wanted = &tokens[..tokens.len().saturating_sub(1)];
        let path = self.walk(wanted);
        let matched: usize = path.iter().map(|&(_, take)| take).sum();
        let state = if matched > shared {
            self.assemble(&path)
        } else {
            None
        };
        let reused = match state {
            Some(_) => matched,
            None => shared.min(wanted.len()),
        };
        if reused == 0 {
            self.misses += 1;
        } else {
            self.hits += 1;
            self.reused_tokens += reused as u64;
        }
        if matched > 0 {
            let now = self.tick();
            for &(id, _) in &path {
                self.touch(id, now);
            }
        }
        state.map(|state| (state, matched))
    }

    /// The length [`PrefixCache::lookup`] would match, read-only.
    pub fn peek(&self, tokens: &[u32]) -> usize {
        let wanted = &tokens[..tokens.len().saturating_sub(1)];
        self.walk(wanted).iter().map(|&(_, take)| take).sum()
    }

    /// Stores `state` (whose length must equal `tokens.len()`) under `tokens`, keeping only the
    /// positions no stored sequence already covers, then evicts least-recently-used leaves
    /// beyond `max_entries` or `max_bytes`.
    pub fn store(&mut self, tokens: &[u32], state: S) {
        debug_assert_eq!(
            state.len(),
            tokens.len(),
            "a stored state covers its tokens"
        );
        if tokens.is_empty() || state.len() != tokens.len() {
            return;
        }
        let now = self.tick();
        let mut node = ROOT;
        let mut pos = 0;
        while pos < tokens.len() {
            let rest = &tokens[pos..];
            let Some(child) = self.node(node).children.get(&rest[0]).copied() else {
                self.add_leaf(node, rest, &state, pos, now);
                break;
            };
            let common = common_prefix(&self.node(child).edge, rest);
            if common == rest.len() || common == self.node(child).edge.len() {
                // `tokens` ends inside or at the end of this edge, or continues below it.
                self.touch(child, now);
                node = child;
                pos += common;
                continue;
            }
            match self.split(child, common) {
                Some(mid) => {
                    self.touch(mid, now);
                    node = mid;
                    pos += common;
                }
                None => break,
            }
        }
        self.evict();
    }

    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            hits: self.hits,
            misses: self.misses,
            reused_tokens: self.reused_tokens,
            evictions: self.evictions,
            bytes: self.bytes,
            entries: self.leaves.len() as u64,
        }
    }

    /// Drops every entry and zeroes the counters: the cache is as new, with the same budgets.
    pub fn reset(&mut self) {
        *self = PrefixCache::new(self.max_entries, self.max_bytes);
    }

    /// The nodes `tokens` runs through from the root, each with how many of its edge tokens
    /// match (all but possibly the last).
    fn walk(&self, tokens: &[u32]) -> Vec<(NodeId, usize)> {
        let mut path = Vec::new();
        let mut node = ROOT;
        let mut pos = 0;
        while let Some(&child) = tokens
            .get(pos)
            .and_then(|first| self.node(node).children.get(first))
        {
            let edge = &self.node(child).edge;
            let take = common_prefix(edge, &tokens[pos..]);
            path.push((child, take));
            pos += take;
            if take < edge.len() {
                break;
            }
            node = child;
        }
        path
    }

    /// The state of a walked path: its segments, the last one cropped to what matched.
    fn assemble(&self, path: &[(NodeId, usize)]) -> Option<S> {
        let parts = path
            .iter()
            .map(|&(id, take)| {
                let kv = &self.node(id).kv;
                if take < kv.len() {
                    kv.prefix(take)
                } else {
                    Some(kv.clone())
                }
            })
            .collect::<Option<Vec<_>>>()?;
        S::concat(&parts)
    }

    /// Hangs `tokens` (positions `start..` of `state`) below `parent` as a new leaf.
    fn add_leaf(&mut self, parent: NodeId, tokens: &[u32], state: &S, start: usize, now: u64) {
        let Some(kv) = state.slice(start, tokens.len()) else {
            return;
        };
        self.bytes += kv.bytes();
        let id = self.insert(Node {
            parent,
            edge: tokens.to_vec(),
            kv,
            children: HashMap::new(),
            stamp: now,
        });
        let was_leaf = self.is_leaf(parent);
        let parent_node = self.node_mut(parent);
        parent_node.children.insert(tokens[0], id);
        let parent_stamp = parent_node.stamp;
        if was_leaf {
            self.leaves.remove(&(parent_stamp, parent));
        }
        self.leaves.insert((now, id));
    }

    /// Cuts `child`'s edge after `at` tokens (0 < at < edge length): a new node takes the first
    /// part and becomes `child`'s parent. Returns the new node, or `None` (tree unchanged) if the
    /// segment could not be copied.
    fn split(&mut self, child: NodeId, at: usize) -> Option<NodeId> {
        let old = self.node(child);
        let head = old.kv.slice(0, at)?;
        let tail = old.kv.slice(at, old.edge.len() - at)?;
        let (parent, stamp, old_bytes) = (old.parent, old.stamp, old.kv.bytes());
        let head_tokens = old.edge[..at].to_vec();
        let (first, tail_first) = (head_tokens[0], old.edge[at]);
        self.bytes = self.bytes - old_bytes + head.bytes() + tail.bytes();
        let mid = self.insert(Node {
            parent,
            children: HashMap::from([(tail_first, child)]),
            edge: head_tokens,
            kv: head,
            stamp,
        });
        let old = self.node_mut(child);
        old.edge.drain(..at);
        old.kv = tail;
        old.parent = mid;
        self.node_mut(parent).children.insert(first, mid);
        Some(mid)
    }

    /// Drops least-recently-used leaves while a budget is exceeded.
    fn evict(&mut self) {
        while self.over_budget() {
            let Some((stamp, leaf)) = self.leaves.pop_first() else {
                break;
            };
            let Some(node) = self.nodes[leaf].take() else {
                continue;
            };
            debug_assert_eq!(stamp, node.stamp);
            self.free.push(leaf);
            self.bytes -= node.kv.bytes();
            self.evictions += 1;
            let parent = self.node_mut(node.parent);
            parent.children.remove(&node.edge[0]);
            if node.parent != ROOT && parent.children.is_empty() {
                let parent_stamp = parent.stamp;
                self.leaves.insert((parent_stamp, node.parent));
            }
        }
    }

    fn over_budget(&self) -> bool {
        self.leaves.len() > self.max_entries || (self.max_bytes > 0 && self.bytes > self.max_bytes)
    }

    /// Marks `id` as used at `now`, keeping the leaf order in step.
    fn touch(&mut self, id: NodeId, now: u64) {
        let leaf = self.is_leaf(id);
        let node = self.node_mut(id);
        let old = std::mem::replace(&mut node.stamp, now);
        if leaf {
            self.leaves.remove(&(old, id));
            self.leaves.insert((now, id));
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn is_leaf(&self, id: NodeId) -> bool {
        id != ROOT && self.node(id).children.is_empty()
    }

    fn insert(&mut self, node: Node<S>) -> NodeId {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    fn node(&self, id: NodeId) -> &Node<S> {
        self.nodes[id]
            .as_ref()
            .expect("tree links point at live nodes")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node<S> {
        self.nodes[id]
            .as_mut()
            .expect("tree links point at live nodes")
    }
}

impl<S: Segment> PrefixStore<S> for PrefixCache<S> {
    fn lookup(&mut self, tokens: &[u32], shared: usize) -> Option<(S, usize)> {
        PrefixCache::lookup(self, tokens, shared)
    }

    fn store(&mut self, tokens: &[u32], state: S) {
        PrefixCache::store(self, tokens, state)
    }

    fn peek(&self, tokens: &[u32]) -> usize {
        PrefixCache::peek(self, tokens)
    }
}

/// How many leading tokens `a` and `b` share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests;
