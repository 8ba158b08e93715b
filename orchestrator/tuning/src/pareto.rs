//! Several objectives: Pareto dominance, non-dominated sorting, crowding
//! distance and hypervolume, on value vectors already turned into
//! minimisation ([`minimised`]). Pure functions: NSGA-II selects with
//! them, `salus-tune best` prints the front, and `bench samplers` scores
//! fronts by hypervolume.

use crate::objective::Direction;

/// `values` with every maximised objective negated, so that smaller is
/// better everywhere.
pub fn minimised(values: &[f64], directions: &[Direction]) -> Vec<f64> {
    values
        .iter()
        .zip(directions)
        .map(|(&v, d)| match d {
            Direction::Minimize => v,
            Direction::Maximize => -v,
        })
        .collect()
}

/// Whether `a` dominates `b` (minimisation): no worse in every objective,
/// better in one.
pub fn dominates(a: &[f64], b: &[f64]) -> bool {
    a.iter().zip(b).all(|(x, y)| x <= y) && a.iter().zip(b).any(|(x, y)| x < y)
}

/// Dominance under constraints (Deb's rule, as Optuna's NSGA-II applies
/// it): a feasible point (`violation` 0) beats an infeasible one, the
/// smaller violation wins between infeasible ones, and feasible ones
/// compare by [`dominates`].
pub fn constrained_dominates(a: &[f64], a_violation: f64, b: &[f64], b_violation: f64) -> bool {
    match (a_violation > 0.0, b_violation > 0.0) {
        (false, true) => true,
        (true, false) => false,
        (true, true) => a_violation < b_violation,
        (false, false) => dominates(a, b),
    }
}

/// The indices of `points` that nothing in `points` dominates, in order.
pub fn front(points: &[Vec<f64>]) -> Vec<usize> {
    (0..points.len())
        .filter(|&i| !points.iter().any(|q| dominates(q, &points[i])))
        .collect()
}

/// Fast non-dominated sorting (Deb et al. 2002): the fronts, best first,
/// each as indices into `points` in ascending order.
pub fn sort_fronts(points: &[Vec<f64>]) -> Vec<Vec<usize>> {
    sort_fronts_by(points.len(), |i, j| dominates(&points[i], &points[j]))
}

/// [`sort_fronts`] of `n` points under any dominance relation `dom(i, j)`
/// (i dominates j), such as [`constrained_dominates`].
pub fn sort_fronts_by(n: usize, dom: impl Fn(usize, usize) -> bool) -> Vec<Vec<usize>> {
    let mut dominated_by = vec![0usize; n];
    let mut dominating: Vec<Vec<usize>> = vec![Vec::new(); n];
    for i in 0..n {
        for j in 0..n {
            if dom(i, j) {
                dominating[i].push(j);
            } else if dom(j, i) {
                dominated_by[i] += 1;
            }
        }
    }
    let mut fronts = Vec::new();
    let mut current: Vec<usize> = (0..n).filter(|&i| dominated_by[i] == 0).collect();
    while !current.is_empty() {
        let mut next = Vec::new();
        for &i in &current {
            for &j in &dominating[i] {
                dominated_by[j] -= 1;
                if dominated_by[j] == 0 {
                    next.push(j);
                }
            }
        }
        next.sort_unstable();
        fronts.push(current);
        current = next;
    }
    fronts
}

/// Crowding distance of each point of one front (Deb et al. 2002): the
/// extremes of each objective get infinity, the others the sum over
/// objectives of their neighbours' gap, normalised by the objective's range.
pub fn crowding(points: &[&[f64]]) -> Vec<f64> {
    let n = points.len();
    let mut distance = vec![0.0; n];
    if n <= 2 {
        return vec![f64::INFINITY; n];
    }
    let columns: Vec<Vec<f64>> = (0..points[0].len())
        .map(|k| points.iter().map(|p| p[k]).collect())
        .collect();
    for col in &columns {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| col[a].total_cmp(&col[b]));
        let (lo, hi) = (col[order[0]], col[order[n - 1]]);
        distance[order[0]] = f64::INFINITY;
        distance[order[n - 1]] = f64::INFINITY;
        let range = hi - lo;
        if range <= 0.0 || !range.is_finite() {
            continue;
        }
        for w in 1..n - 1 {
            distance[order[w]] += (col[order[w + 1]] - col[order[w - 1]]) / range;
        }
    }
    distance
}

/// The hypervolume `points` dominate up to `reference` (minimisation):
/// points not strictly better than the reference in every objective add
/// nothing. Exact, by slicing along the last objective; fine for the few
/// hundred points and few objectives of a study.
pub fn hypervolume(points: &[Vec<f64>], reference: &[f64]) -> f64 {
    let inside: Vec<Vec<f64>> = points
        .iter()
        .filter(|p| p.iter().zip(reference).all(|(x, r)| x < r))
        .cloned()
        .collect();
    volume(inside, reference)
}

fn volume(mut points: Vec<Vec<f64>>, reference: &[f64]) -> f64 {
    let d = reference.len();
    if points.is_empty() {
        return 0.0;
    }
    if d == 1 {
        let best = points.iter().map(|p| p[0]).fold(f64::INFINITY, f64::min);
        return reference[0] - best;
    }
    if d == 2 {
        points.sort_by(|a, b| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1])));
        let (mut area, mut floor) = (0.0, reference[1]);
        for p in points {
            if p[1] < floor {
                area += (reference[0] - p[0]) * (floor - p[1]);
                floor = p[1];
            }
        }
        return area;
    }
    // Slabs between consecutive values of the last objective: in each, the
    // points at or below it project onto the first d - 1 objectives.
    points.sort_by(|a, b| a[d - 1].total_cmp(&b[d - 1]));
    let mut total = 0.0;
    for i in 0..points.len() {
        let top = points.get(i + 1).map_or(reference[d - 1], |p| p[d - 1]);
        let height = top - points[i][d - 1];
        if height <= 0.0 {
            continue;
        }
        let below: Vec<Vec<f64>> = points[..=i].iter().map(|p| p[..d - 1].to_vec()).collect();
        let kept: Vec<Vec<f64>> = front(&below)
            .into_iter()
            .map(|j| below[j].clone())
            .collect();
        total += height * volume(kept, &reference[..d - 1]);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dominance_and_fronts() {
        assert!(dominates(&[1.0, 2.0], &[1.0, 3.0]));
        assert!(!dominates(&[1.0, 2.0], &[1.0, 2.0]));
        assert!(!dominates(&[0.0, 3.0], &[1.0, 2.0]));
        let pts = vec![
            vec![1.0, 5.0],
            vec![2.0, 3.0],
            vec![3.0, 4.0],
            vec![4.0, 1.0],
            vec![5.0, 5.0],
        ];
        assert_eq!(front(&pts), vec![0, 1, 3]);
        assert_eq!(sort_fronts(&pts), vec![vec![0, 1, 3], vec![2], vec![4]]);
        assert_eq!(
            minimised(&[0.9, 100.0], &[Direction::Maximize, Direction::Minimize]),
            vec![-0.9, 100.0]
        );
    }

    #[test]
    fn a_feasible_point_beats_any_infeasible_one() {
        // Worse in both objectives, but feasible.
        assert!(constrained_dominates(&[9.0, 9.0], 0.0, &[1.0, 1.0], 0.5));
        assert!(!constrained_dominates(&[1.0, 1.0], 0.5, &[9.0, 9.0], 0.0));
        // Both infeasible: the smaller violation.
        assert!(constrained_dominates(&[9.0, 9.0], 0.1, &[1.0, 1.0], 0.5));
        // Both feasible: plain dominance.
        assert!(constrained_dominates(&[1.0, 1.0], 0.0, &[2.0, 2.0], 0.0));
        assert!(!constrained_dominates(&[1.0, 3.0], 0.0, &[2.0, 2.0], 0.0));
        let pts = [vec![1.0, 1.0], vec![5.0, 5.0], vec![2.0, 0.5]];
        let violation = [0.3, 0.0, 0.0];
        let fronts = sort_fronts_by(3, |i, j| {
            constrained_dominates(&pts[i], violation[i], &pts[j], violation[j])
        });
        assert_eq!(fronts, vec![vec![2], vec![1], vec![0]]);
    }

    #[test]
    fn crowding_favours_the_extremes_and_the_lonely() {
        let pts: Vec<Vec<f64>> = vec![
            vec![0.0, 4.0],
            vec![1.0, 3.0],
            vec![1.2, 2.8],
            vec![4.0, 0.0],
        ];
        let refs: Vec<&[f64]> = pts.iter().map(|p| p.as_slice()).collect();
        let d = crowding(&refs);
        assert!(d[0].is_infinite() && d[3].is_infinite());
        // Point 2 has a far neighbour (4, 0); point 1 is boxed in.
        assert!(d[2] > d[1], "{d:?}");
        assert!((d[1] - (1.2 / 4.0 + 1.2 / 4.0)).abs() < 1e-12);
    }

    #[test]
    fn hypervolume_of_known_sets() {
        // Two boxes of 2x1 and 1x2 overlapping in a 1x1 square.
        let pts = vec![vec![1.0, 2.0], vec![2.0, 1.0]];
        assert_eq!(hypervolume(&pts, &[3.0, 3.0]), 3.0);
        // A dominated point and one outside the reference add nothing.
        let more = vec![
            vec![1.0, 2.0],
            vec![2.0, 1.0],
            vec![2.5, 2.5],
            vec![0.5, 9.0],
        ];
        assert_eq!(hypervolume(&more, &[3.0, 3.0]), 3.0);
        // Three dimensions: a unit cube's corner, and two of them.
        assert_eq!(hypervolume(&[vec![0.0, 0.0, 0.0]], &[1.0, 1.0, 1.0]), 1.0);
        let two = vec![vec![0.0, 0.5, 0.5], vec![0.5, 0.0, 0.0]];
        // 1 x 0.5 x 0.5 + 0.5 x 1 x 1 - overlap 0.5 x 0.5 x 0.5.
        assert!((hypervolume(&two, &[1.0, 1.0, 1.0]) - 0.625).abs() < 1e-12);
    }

    proptest! {
        /// Sliced exactly, the volume equals a fine grid count.
        #[test]
        fn hypervolume_matches_a_grid_count(
            pts in proptest::collection::vec(proptest::collection::vec(0u8..10, 3), 1..8)
        ) {
            let pts: Vec<Vec<f64>> = pts.iter().map(|p| p.iter().map(|&x| x as f64).collect()).collect();
            let mut cells = 0;
            for a in 0..10 { for b in 0..10 { for c in 0..10 {
                let cell = [a as f64, b as f64, c as f64];
                if pts.iter().any(|p| p.iter().zip(&cell).all(|(x, y)| x <= y)) { cells += 1; }
            }}}
            prop_assert_eq!(hypervolume(&pts, &[10.0, 10.0, 10.0]), cells as f64);
        }

        /// Every point is in exactly one front, and none dominates another
        /// of its front.
        #[test]
        fn fronts_partition_and_hold_no_dominance(
            pts in proptest::collection::vec(proptest::collection::vec(0u8..6, 2), 0..30)
        ) {
            let pts: Vec<Vec<f64>> = pts.iter().map(|p| p.iter().map(|&x| x as f64).collect()).collect();
            let fronts = sort_fronts(&pts);
            let mut all: Vec<usize> = fronts.concat();
            all.sort_unstable();
            prop_assert_eq!(all, (0..pts.len()).collect::<Vec<_>>());
            for f in &fronts {
                for &i in f { for &j in f { prop_assert!(!dominates(&pts[i], &pts[j])); } }
            }
        }
    }
}
