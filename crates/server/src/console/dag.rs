//! The layered layout of a dependency graph, for the console to draw: which layer (column)
//! each job goes in, its order within the layer, the coordinates of its box and the route of
//! each edge. Plain functions over node indices and edges: this module knows nothing of jobs,
//! markup, the API or the store, and must not read any of them.
//!
//! Upstreams stand left of what waits for them. A job's layer is the length of the longest
//! chain of upstreams above it, so every edge goes from a lower layer to a higher one; an
//! edge that spans several layers passes through a placeholder in each layer between, which
//! takes part in the ordering like a job. The order within layers comes from barycenter
//! sweeps (each slot moves to the mean position of its neighbours in the layer before, then
//! after), keeping the order with the fewest crossings seen. The sizes are bounded: at most
//! [`MAX_NODES`] jobs and [`MAX_PLACEHOLDERS`] placeholders are laid out.

/// Jobs laid out at most; the rest are left out (the caller says so).
pub const MAX_NODES: usize = 1000;
/// Placeholders for long edges at most; longer edges past it are drawn straight.
pub const MAX_PLACEHOLDERS: usize = 4000;
/// Width and height of a job's box, in the drawing's units.
pub const NODE_W: f64 = 196.0;
pub const NODE_H: f64 = 44.0;
/// Space between layers, between boxes of a layer, and around the drawing.
const COLUMN_GAP: f64 = 56.0;
const ROW_GAP: f64 = 14.0;
const PLACEHOLDER_H: f64 = 6.0;
pub const MARGIN: f64 = 8.0;
/// Barycenter sweeps (down then up) tried at most.
const SWEEPS: usize = 12;

/// A box's top-left corner.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: f64,
}

/// Where everything goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Each laid-out job's layer, by node index (`None`: beyond [`MAX_NODES`]).
    pub layer: Vec<Option<usize>>,
    /// Each laid-out job's box (top-left corner), by node index.
    pub boxes: Vec<Option<Point>>,
    /// Each drawn edge: its index in the input, and the points it passes through, from the
    /// right side of the upstream's box to the left side of the dependant's.
    pub routes: Vec<(usize, Vec<Point>)>,
    /// Edges not drawn: to or from a job left out, onto itself, or closing a cycle.
    pub dropped: usize,
    pub width: f64,
    pub height: f64,
}

/// One slot of a layer: a job, or a placeholder of a long edge.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    Node(usize),
    Placeholder,
}

/// The layer of each of `n` nodes: the longest chain of upstreams above it. `edges` are
/// `(upstream, dependant)`. A cycle (which the store refuses, so only a damaged graph has
/// one) is broken at its smallest node: the edges into it from the cycle are ignored.
pub fn layers(n: usize, edges: &[(usize, usize)]) -> Vec<usize> {
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut waiting = vec![0usize; n];
    for &(u, v) in edges {
        if u < n && v < n && u != v {
            preds[v].push(u);
            succs[u].push(v);
            waiting[v] += 1;
        }
    }
    let mut layer = vec![0usize; n];
    let mut done = vec![false; n];
    let mut ready: std::collections::VecDeque<usize> =
        (0..n).filter(|&v| waiting[v] == 0).collect();
    let mut left = n;
    let mut next_forced = 0;
    while left > 0 {
        let v = match ready.pop_front() {
            Some(v) => v,
            None => {
                // Only a cycle is left: take its smallest node as if it were ready.
                while next_forced < n && done[next_forced] {
                    next_forced += 1;
                }
                if next_forced >= n {
                    break;
                }
                next_forced
            }
        };
        if done[v] {
            continue;
        }
        done[v] = true;
        left -= 1;
        layer[v] = preds[v]
            .iter()
            .filter(|&&u| done[u])
            .map(|&u| layer[u] + 1)
            .max()
            .unwrap_or(0);
        for &w in &succs[v] {
            waiting[w] = waiting[w].saturating_sub(1);
            if waiting[w] == 0 && !done[w] {
                ready.push_back(w);
            }
        }
    }
    layer
}

/// How many pairs of edges cross between two adjacent layers, given each edge as the
/// positions of its ends `(upper, lower)`.
pub fn crossings(mut segments: Vec<(usize, usize)>) -> usize {
    segments.sort_unstable();
    let size = segments.iter().map(|s| s.1 + 1).max().unwrap_or(0);
    // A Fenwick tree over the lower ends seen so far: each segment crosses those before it
    // (upper end not after its own) whose lower end is strictly after its own.
    let mut tree = vec![0usize; size + 1];
    let mut total = 0;
    for (seen, &(_, lower)) in segments.iter().enumerate() {
        let mut i = lower + 1;
        let mut not_after = 0;
        while i > 0 {
            not_after += tree[i];
            i -= i & i.wrapping_neg();
        }
        total += seen - not_after;
        let mut i = lower + 1;
        while i <= size {
            tree[i] += 1;
            i += i & i.wrapping_neg();
        }
    }
    total
}

/// The layered layout of the first [`MAX_NODES`] of `n` nodes with `edges`
/// `(upstream, dependant)`. Nodes start in index order within their layer (give them sorted,
/// by name say, for a stable drawing).
pub fn layout(n: usize, edges: &[(usize, usize)]) -> Layout {
    let kept = n.min(MAX_NODES);
    let inside: Vec<(usize, usize)> = edges
        .iter()
        .copied()
        .filter(|&(u, v)| u < kept && v < kept && u != v)
        .collect();
    let layer = layers(kept, &inside);
    let depth = layer.iter().max().map_or(0, |m| m + 1);

    // Slots per layer, and the chain of slots each forward edge passes through.
    let mut slots: Vec<Slot> = (0..kept).map(Slot::Node).collect();
    let mut slot_layer: Vec<usize> = layer.clone();
    let mut chains: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut dropped = edges.len() - inside.len();
    let mut placeholders = 0;
    for (index, &(u, v)) in edges.iter().enumerate() {
        if !(u < kept && v < kept && u != v) {
            continue;
        }
        if layer[u] >= layer[v] {
            dropped += 1;
            continue;
        }
        let span = layer[v] - layer[u];
        let mut chain = vec![u];
        if span > 1 && placeholders + span - 1 <= MAX_PLACEHOLDERS {
            for l in layer[u] + 1..layer[v] {
                chain.push(slots.len());
                slots.push(Slot::Placeholder);
                slot_layer.push(l);
                placeholders += 1;
            }
        }
        chain.push(v);
        chains.push((index, chain));
    }
    let mut order: Vec<Vec<usize>> = vec![Vec::new(); depth];
    for (slot, &l) in slot_layer.iter().enumerate() {
        order[l].push(slot);
    }
    // Neighbours in the layer before (up) and after (down), through adjacent chain links.
    let mut up: Vec<Vec<usize>> = vec![Vec::new(); slots.len()];
    let mut down: Vec<Vec<usize>> = vec![Vec::new(); slots.len()];
    for (_, chain) in &chains {
        for pair in chain.windows(2) {
            if slot_layer[pair[1]] == slot_layer[pair[0]] + 1 {
                down[pair[0]].push(pair[1]);
                up[pair[1]].push(pair[0]);
            }
        }
    }
    let order = ordered(order, &up, &down, slots.len());

    // Coordinates: a column per layer, each column's slots stacked and centred.
    let height_of = |slot: usize| match slots[slot] {
        Slot::Node(_) => NODE_H,
        Slot::Placeholder => PLACEHOLDER_H,
    };
    let column_height = |column: &Vec<usize>| -> f64 {
        let sum: f64 = column.iter().map(|&s| height_of(s)).sum();
        sum + ROW_GAP * column.len().saturating_sub(1) as f64
    };
    let tallest = order.iter().map(column_height).fold(0.0, f64::max);
    let mut at = vec![Point { x: 0.0, y: 0.0 }; slots.len()];
    for (l, column) in order.iter().enumerate() {
        let x = MARGIN + l as f64 * (NODE_W + COLUMN_GAP);
        let mut y = MARGIN + (tallest - column_height(column)) / 2.0;
        for &slot in column {
            at[slot] = Point { x, y };
            y += height_of(slot) + ROW_GAP;
        }
    }
    let mut boxes = vec![None; n];
    let mut layers_out = vec![None; n];
    for v in 0..kept {
        boxes[v] = Some(at[v]);
        layers_out[v] = Some(layer[v]);
    }
    let routes = chains
        .into_iter()
        .map(|(index, chain)| {
            let mut points = Vec::with_capacity(chain.len() * 2);
            let last = chain.len() - 1;
            for (i, &slot) in chain.iter().enumerate() {
                let p = at[slot];
                let middle = p.y + height_of(slot) / 2.0;
                if i > 0 {
                    points.push(Point { x: p.x, y: middle });
                }
                if i < last {
                    points.push(Point {
                        x: p.x + NODE_W,
                        y: middle,
                    });
                }
            }
            (index, points)
        })
        .collect();
    Layout {
        layer: layers_out,
        boxes,
        routes,
        dropped,
        width: 2.0 * MARGIN + depth as f64 * NODE_W + depth.saturating_sub(1) as f64 * COLUMN_GAP,
        height: 2.0 * MARGIN + tallest,
    }
}

/// The order within layers after barycenter sweeps: the one with the fewest crossings seen.
fn ordered(
    mut order: Vec<Vec<usize>>,
    up: &[Vec<usize>],
    down: &[Vec<usize>],
    slots: usize,
) -> Vec<Vec<usize>> {
    let mut position = vec![0usize; slots];
    let place = |order: &Vec<Vec<usize>>, position: &mut Vec<usize>| {
        for column in order {
            for (i, &slot) in column.iter().enumerate() {
                position[slot] = i;
            }
        }
    };
    let count = |order: &Vec<Vec<usize>>, position: &Vec<usize>| -> usize {
        order
            .iter()
            .map(|column| {
                let segments = column
                    .iter()
                    .flat_map(|&s| down[s].iter().map(move |&t| (position[s], position[t])))
                    .collect();
                crossings(segments)
            })
            .sum()
    };
    place(&order, &mut position);
    let mut best = order.clone();
    let mut fewest = count(&order, &position);
    for sweep in 0..SWEEPS {
        if fewest == 0 {
            break;
        }
        let downward = sweep % 2 == 0;
        let layers: Vec<usize> = if downward {
            (1..order.len()).collect()
        } else {
            (0..order.len().saturating_sub(1)).rev().collect()
        };
        for l in layers {
            let neighbours = if downward { up } else { down };
            let mut keyed: Vec<(f64, usize, usize)> = order[l]
                .iter()
                .enumerate()
                .map(|(i, &slot)| {
                    let around = &neighbours[slot];
                    let key = if around.is_empty() {
                        i as f64
                    } else {
                        around.iter().map(|&s| position[s] as f64).sum::<f64>()
                            / around.len() as f64
                    };
                    (key, i, slot)
                })
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            order[l] = keyed.into_iter().map(|(_, _, slot)| slot).collect();
            for (i, &slot) in order[l].iter().enumerate() {
                position[slot] = i;
            }
        }
        let now = count(&order, &position);
        if now < fewest {
            fewest = now;
            best = order.clone();
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator, for graphs of every shape.
    struct Lcg(u64);
    impl Lcg {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 33) % n.max(1) as u64) as usize
        }
    }

    /// A random acyclic graph: edges only from a lower index to a higher one.
    fn random_dag(rng: &mut Lcg, n: usize, edges: usize) -> Vec<(usize, usize)> {
        (0..edges)
            .filter_map(|_| {
                let a = rng.below(n);
                let b = rng.below(n);
                (a != b).then(|| (a.min(b), a.max(b)))
            })
            .collect()
    }

    fn overlap(a: Point, b: Point) -> bool {
        a.x < b.x + NODE_W && b.x < a.x + NODE_W && a.y < b.y + NODE_H && b.y < a.y + NODE_H
    }

    fn check_invariants(n: usize, edges: &[(usize, usize)], out: &Layout) {
        let boxes: Vec<Point> = out.boxes.iter().flatten().copied().collect();
        assert_eq!(boxes.len(), n.min(MAX_NODES));
        for (i, a) in boxes.iter().enumerate() {
            assert!(a.x >= 0.0 && a.y >= 0.0);
            assert!(a.x + NODE_W <= out.width + 1e-6 && a.y + NODE_H <= out.height + 1e-6);
            for b in &boxes[i + 1..] {
                assert!(!overlap(*a, *b), "{a:?} overlaps {b:?}");
            }
        }
        for (index, route) in &out.routes {
            let (u, v) = edges[*index];
            let (lu, lv) = (out.layer[u].unwrap(), out.layer[v].unwrap());
            assert!(lu < lv, "edge {u}->{v} goes from layer {lu} to {lv}");
            assert!(
                route.windows(2).all(|p| p[0].x <= p[1].x),
                "routes go rightwards"
            );
        }
        assert_eq!(out.routes.len() + out.dropped, edges.len());
    }

    #[test]
    fn layers_follow_the_longest_chain_of_upstreams() {
        // a -> b -> c, a -> c: c is two layers right of a, not one.
        assert_eq!(layers(3, &[(0, 1), (1, 2), (0, 2)]), vec![0, 1, 2]);
        // A cycle still gets layers, and the rest of the graph too.
        let cyclic = layers(4, &[(0, 1), (1, 2), (2, 1), (2, 3)]);
        assert_eq!(cyclic.len(), 4);
        assert!(cyclic[3] > cyclic[2]);
    }

    #[test]
    fn crossings_count_only_pairs_that_cross() {
        assert_eq!(crossings(vec![(0, 0), (1, 1)]), 0);
        assert_eq!(crossings(vec![(0, 1), (1, 0)]), 1);
        // Sharing an end is no crossing.
        assert_eq!(crossings(vec![(0, 0), (0, 1), (1, 1)]), 0);
        assert_eq!(crossings(vec![(0, 2), (1, 1), (2, 0)]), 3);
    }

    /// The crossings of the drawn edges, column gap by column gap.
    fn drawn_crossings(out: &Layout) -> usize {
        let mut gaps: std::collections::BTreeMap<i64, Vec<(usize, usize)>> = Default::default();
        for (_, route) in &out.routes {
            for pair in route.chunks(2) {
                if let [exit, entry] = pair {
                    gaps.entry(exit.x as i64)
                        .or_default()
                        .push(((exit.y * 10.0) as usize, (entry.y * 10.0) as usize));
                }
            }
        }
        gaps.into_values().map(crossings).sum()
    }

    #[test]
    fn a_known_graph_is_untangled() {
        // Two pipelines given interleaved: a1 -> b1, a2 -> b2, but b2 listed first.
        // 0: a1, 1: a2, 2: b2, 3: b1 — in index order the two edges cross.
        let edges = [(0, 3), (1, 2)];
        let out = layout(4, &edges);
        check_invariants(4, &edges, &out);
        assert_eq!(drawn_crossings(&out), 0);

        // A -> B -> C, A -> D, and E -> C past B's column: nothing need cross.
        let edges = [(0, 1), (1, 2), (0, 3), (4, 2)];
        let out = layout(5, &edges);
        check_invariants(5, &edges, &out);
        assert_eq!(drawn_crossings(&out), 0);

        // Ordering finds no worse than the order it was given, on graphs of every shape.
        let mut rng = Lcg(3);
        for _ in 0..50 {
            let n = 2 + rng.below(20);
            let m = rng.below(2 * n);
            let edges = random_dag(&mut rng, n, m);
            let out = layout(n, &edges);
            let given = {
                // The same graph, laid out with no sweep at all: compare totals.
                let up: Vec<usize> = layers(n, &edges);
                let straight = edges.iter().all(|&(u, v)| up[v] == up[u] + 1);
                straight.then(|| {
                    let mut columns: std::collections::BTreeMap<usize, Vec<(usize, usize)>> =
                        Default::default();
                    let rank = |v: usize| (0..v).filter(|&w| up[w] == up[v]).count();
                    for &(u, v) in &edges {
                        columns.entry(up[u]).or_default().push((rank(u), rank(v)));
                    }
                    columns.into_values().map(crossings).sum::<usize>()
                })
            };
            if let Some(given) = given {
                assert!(drawn_crossings(&out) <= given);
            }
        }
    }

    #[test]
    fn a_long_edge_passes_through_the_layers_between() {
        let edges = [(0, 1), (1, 2), (2, 3), (0, 3)];
        let out = layout(4, &edges);
        check_invariants(4, &edges, &out);
        let (_, long) = out.routes.iter().find(|(i, _)| *i == 3).unwrap();
        // Out of a, through two placeholders (in and out of each), into d.
        assert_eq!(long.len(), 6);
    }

    #[test]
    fn random_graphs_keep_the_invariants() {
        let mut rng = Lcg(7);
        for round in 0..200 {
            let n = 1 + rng.below(40);
            let m = rng.below(3 * n);
            let mut edges = random_dag(&mut rng, n, m);
            if round % 10 == 0 && n > 2 {
                edges.push((n - 1, 0)); // a damaged graph with a cycle
            }
            let out = layout(n, &edges);
            check_invariants(n, &edges, &out);
        }
    }

    #[test]
    fn a_thousand_jobs_and_more_stay_bounded() {
        let mut rng = Lcg(11);
        let n = 1500;
        let edges = random_dag(&mut rng, n, 3000);
        let started = std::time::Instant::now();
        let out = layout(n, &edges);
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        assert_eq!(out.boxes.iter().flatten().count(), MAX_NODES);
        assert!(out.boxes[MAX_NODES].is_none());
        let depth = out.layer.iter().flatten().max().unwrap() + 1;
        assert!(depth <= MAX_NODES);
        let most_tall = MAX_NODES as f64 * (NODE_H + ROW_GAP)
            + MAX_PLACEHOLDERS as f64 * (PLACEHOLDER_H + ROW_GAP)
            + 2.0 * MARGIN;
        assert!(
            out.height <= most_tall
                && out.width <= depth as f64 * (NODE_W + COLUMN_GAP) + 2.0 * MARGIN
        );
        let kept: Vec<(usize, usize)> = edges.clone();
        check_invariants(n, &kept, &out);
    }
}
