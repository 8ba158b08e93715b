//! Several objectives: Pareto dominance, non-dominated sorting, crowding
//! distance and hypervolume, on value vectors already turned into
//! minimisation ([`minimised`]), and NSGA-III's reference points,
//! normalisation and niching. Pure functions: NSGA-II and NSGA-III select
//! with them, `salus-tune best` prints the front, and `bench samplers` scores
//! fronts by hypervolume.

use crate::objective::Direction;

/// `values` with every maximised objective negated, so that smaller is
/// better everywhere.
pub fn minimised(values: &[f64], directions: &[Direction]) -> Vec<f64> {
    values
        .iter()
        .zip(directions)
        .map(|(&v, d)| d.minimised(v))
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

/// NSGA-III's structured reference points (Das and Dennis): every point
/// of the unit simplex in `m` objectives whose coordinates are multiples
/// of `1 / divisions`, in lexicographic order. Optuna's default is 3
/// divisions (10 points for 3 objectives, 4 for 2).
pub fn simplex_lattice(m: usize, divisions: usize) -> Vec<Vec<f64>> {
    fn fill(
        left: usize,
        k: usize,
        m: usize,
        p: usize,
        cur: &mut Vec<usize>,
        out: &mut Vec<Vec<f64>>,
    ) {
        if k == m - 1 {
            cur.push(left);
            out.push(cur.iter().map(|&c| c as f64 / p as f64).collect());
            cur.pop();
            return;
        }
        for c in (0..=left).rev() {
            cur.push(c);
            fill(left - c, k + 1, m, p, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    if m > 0 && divisions > 0 {
        fill(
            divisions,
            0,
            m,
            divisions,
            &mut Vec::with_capacity(m),
            &mut out,
        );
    }
    out
}

/// NSGA-III's normalisation (Deb and Jain 2014, as Optuna 5 applies it):
/// each objective is shifted so its best value is 0, then divided by the
/// intercept, on its axis, of the hyperplane through the extreme points
/// (each objective's minimiser of the achievement scalarising function
/// with weight 1 on it and 1e6 on the others). Where the extreme points
/// are degenerate, or an intercept is not finite and positive (the paper's
/// rule; Optuna only drops non-finite ones), each objective is divided by
/// its worst value instead.
pub fn normalise(points: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let Some(m) = points.first().map(Vec::len) else {
        return Vec::new();
    };
    let ideal: Vec<f64> = (0..m)
        .map(|j| points.iter().map(|p| p[j]).fold(f64::INFINITY, f64::min))
        .collect();
    let shifted: Vec<Vec<f64>> = points
        .iter()
        .map(|p| p.iter().zip(&ideal).map(|(v, z)| v - z).collect())
        .collect();
    let asf = |p: &[f64], axis: usize| {
        p.iter()
            .enumerate()
            .map(|(j, &v)| if j == axis { v } else { v * 1e6 })
            .fold(f64::NEG_INFINITY, f64::max)
    };
    let extremes = nalgebra::DMatrix::from_fn(m, m, |axis, j| {
        let best = (0..shifted.len())
            .min_by(|&a, &b| asf(&shifted[a], axis).total_cmp(&asf(&shifted[b], axis)))
            .expect("points");
        shifted[best][j]
    });
    let inverse_intercepts = extremes
        .clone()
        .full_piv_lu()
        .solve(&nalgebra::DVector::from_element(m, 1.0))
        .filter(|x| x.iter().all(|v| v.is_finite() && *v > 0.0))
        .filter(|_| extremes.rank(1e-12) == m)
        .map(|x| x.iter().copied().collect::<Vec<f64>>())
        .unwrap_or_else(|| {
            (0..m)
                .map(|j| {
                    let worst = shifted.iter().map(|p| p[j]).fold(0.0, f64::max);
                    if worst > 0.0 { 1.0 / worst } else { 1.0 }
                })
                .collect()
        });
    shifted
        .into_iter()
        .map(|p| {
            p.iter()
                .zip(&inverse_intercepts)
                .map(|(v, s)| v * s)
                .collect()
        })
        .collect()
}

/// Each point's nearest reference line (the line through the origin and a
/// point of `references`) and its perpendicular distance from that line.
pub fn associate(points: &[Vec<f64>], references: &[Vec<f64>]) -> Vec<(usize, f64)> {
    points
        .iter()
        .map(|p| {
            references
                .iter()
                .enumerate()
                .map(|(r, w)| {
                    let ww: f64 = w.iter().map(|x| x * x).sum();
                    let t = p.iter().zip(w).map(|(a, b)| a * b).sum::<f64>() / ww;
                    let d2: f64 = p.iter().zip(w).map(|(a, b)| (a - t * b).powi(2)).sum();
                    (r, d2.sqrt())
                })
                .fold(
                    (usize::MAX, f64::INFINITY),
                    |a, b| if b.1 < a.1 { b } else { a },
                )
        })
        .collect()
}

/// NSGA-III's niching: `k` of the last front's members (`front`, each
/// associated with a reference line and its distance) to join an elite
/// whose members are associated as `elite`. Again and again, of the lines
/// that still have a candidate, one with the fewest elite members is
/// taken (ties at random): with none yet, its closest candidate joins,
/// else one of its candidates at random. Returns indices into `front`.
pub fn niche_select(
    k: usize,
    elite: &[(usize, f64)],
    front: &[(usize, f64)],
    references: usize,
    rng: &mut impl rand::Rng,
) -> Vec<usize> {
    use rand::RngExt;
    let mut count = vec![0usize; references];
    for &(r, _) in elite {
        count[r] += 1;
    }
    let mut left: Vec<Vec<usize>> = vec![Vec::new(); references];
    for (i, &(r, _)) in front.iter().enumerate() {
        left[r].push(i);
    }
    let mut chosen = Vec::with_capacity(k);
    while chosen.len() < k.min(front.len()) {
        let fewest = (0..references)
            .filter(|&r| !left[r].is_empty())
            .map(|r| count[r])
            .min()
            .expect("a candidate is left");
        let lines: Vec<usize> = (0..references)
            .filter(|&r| !left[r].is_empty() && count[r] == fewest)
            .collect();
        let r = lines[rng.random_range(0..lines.len())];
        let at = if fewest == 0 {
            (0..left[r].len())
                .min_by(|&a, &b| front[left[r][a]].1.total_cmp(&front[left[r][b]].1))
                .expect("a candidate")
        } else {
            rng.random_range(0..left[r].len())
        };
        chosen.push(left[r].swap_remove(at));
        count[r] += 1;
    }
    chosen
}

/// Optuna's reference point for a set of loss vectors: 1.1 times the
/// worst value of each objective (0.9 times a negative one), a zero made
/// a tiny positive number, so every point adds volume.
pub fn reference_point(points: &[Vec<f64>]) -> Vec<f64> {
    let d = points.first().map_or(0, Vec::len);
    (0..d)
        .map(|j| {
            let worst = points
                .iter()
                .map(|p| p[j])
                .fold(f64::NEG_INFINITY, f64::max);
            let r = (1.1 * worst).max(0.9 * worst);
            if r == 0.0 { 1e-12 } else { r }
        })
        .collect()
}

/// `k` of `points` chosen greedily for hypervolume up to `reference`
/// (each pick adds the most volume to those before it), as indices in
/// the order picked: the greedy answer to the hypervolume subset
/// selection problem, within `1 - 1/e` of the best subset, as Optuna 5's
/// `_solve_hssp` (which drops repeated points first; a repeat adds no
/// volume here, so it is picked last).
pub fn greedy_subset(points: &[Vec<f64>], k: usize, reference: &[f64]) -> Vec<usize> {
    let k = k.min(points.len());
    let mut chosen: Vec<usize> = Vec::with_capacity(k);
    let mut set: Vec<Vec<f64>> = Vec::with_capacity(k);
    let mut volume_so_far = 0.0;
    // Lazy greedy: a point adds no more volume to a larger set
    // (hypervolume is submodular), so each one's last computed gain bounds
    // its gain now, and a gain just computed that no other bound exceeds
    // is the best. Most gains are never recomputed.
    let mut bound: Vec<f64> = points
        .iter()
        .map(|p| hypervolume(std::slice::from_ref(p), reference))
        .collect();
    let mut fresh = vec![false; points.len()];
    while chosen.len() < k {
        fresh.iter_mut().for_each(|f| *f = false);
        loop {
            // The largest bound, the first point of equals.
            let i =
                (0..points.len())
                    .filter(|i| !chosen.contains(i))
                    .fold(usize::MAX, |best, i| {
                        if best == usize::MAX || bound[i] > bound[best] {
                            i
                        } else {
                            best
                        }
                    });
            if fresh[i] {
                chosen.push(i);
                set.push(points[i].clone());
                volume_so_far = hypervolume(&set, reference);
                break;
            }
            set.push(points[i].clone());
            bound[i] = hypervolume(&set, reference) - volume_so_far;
            set.pop();
            fresh[i] = true;
        }
    }
    chosen
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

    proptest! {
        /// The lazy greedy picks sets of the same volume, pick after pick,
        /// as recomputing every gain at every pick does.
        #[test]
        fn the_lazy_greedy_subset_matches_the_plain_greedy(
            pts in prop::collection::vec(prop::collection::vec(0.0..1.0f64, 3), 1..40),
            k in 1usize..12,
        ) {
            let r = vec![1.1; 3];
            let lazy = greedy_subset(&pts, k, &r);
            let mut plain: Vec<usize> = Vec::new();
            while plain.len() < k.min(pts.len()) {
                let gain = |i: usize| {
                    let mut set: Vec<Vec<f64>> = plain.iter().map(|&j| pts[j].clone()).collect();
                    set.push(pts[i].clone());
                    hypervolume(&set, &r)
                };
                let best = (0..pts.len())
                    .filter(|i| !plain.contains(i))
                    .max_by(|&a, &b| gain(a).total_cmp(&gain(b)).then(b.cmp(&a)))
                    .unwrap();
                plain.push(best);
            }
            prop_assert_eq!(lazy.len(), plain.len());
            for n in 1..=lazy.len() {
                let volume = |picked: &[usize]| {
                    hypervolume(&picked[..n].iter().map(|&j| pts[j].clone()).collect::<Vec<_>>(), &r)
                };
                prop_assert!((volume(&lazy) - volume(&plain)).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn the_greedy_subset_adds_the_most_volume_first() {
        let pts = vec![
            vec![0.0, 4.0],
            vec![1.0, 3.0],
            vec![1.1, 2.9],
            vec![4.0, 0.0],
        ];
        let r = reference_point(&pts);
        assert_eq!(r, vec![1.1 * 4.0, 1.1 * 4.0]);
        // Alone, (1.1, 2.9) boxes the most (3.3 x 1.5); then (4, 0) adds
        // 0.4 x 2.9, (0, 4) 1.1 x 0.4, and (1, 3), beside 2, only 0.1 x 1.4.
        assert_eq!(greedy_subset(&pts, 4, &r), vec![2, 3, 0, 1]);
        assert_eq!(greedy_subset(&pts, 2, &r), vec![2, 3]);
        // A negative worst value: 0.9 of it; a zero: just above it.
        assert_eq!(
            reference_point(&[vec![-2.0, 0.0], vec![-3.0, -1.0]])[0],
            -1.8
        );
        assert!(reference_point(&[vec![-2.0, 0.0]])[1] > 0.0);
    }

    #[test]
    fn the_simplex_lattice_is_das_and_dennis_s() {
        let l = simplex_lattice(3, 3);
        // C(3 + 3 - 1, 3) = 10 points, each on the simplex.
        assert_eq!(l.len(), 10);
        assert!(
            l.iter()
                .all(|p| (p.iter().sum::<f64>() - 1.0).abs() < 1e-12)
        );
        assert_eq!(l[0], vec![1.0, 0.0, 0.0]);
        assert!(l.contains(&vec![1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]));
        assert_eq!(simplex_lattice(2, 3).len(), 4);
        assert_eq!(simplex_lattice(5, 3).len(), 35);
    }

    #[test]
    fn normalising_puts_the_extreme_points_on_the_unit_plane() {
        // The extremes (3, 1) and (1, 5) after the ideal (1, 1) is taken
        // off: (2, 0) and (0, 4), so the intercepts are 2 and 4.
        let pts = vec![vec![3.0, 1.0], vec![1.0, 5.0], vec![2.0, 2.0]];
        let n = normalise(&pts);
        assert_eq!(n, vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![0.5, 0.25]]);
        // Degenerate extremes (one point is both): the worst values.
        let n = normalise(&[vec![0.0, 0.0], vec![2.0, 4.0]]);
        assert_eq!(n[1], vec![1.0, 1.0]);
    }

    #[test]
    fn points_join_the_nearest_reference_line() {
        let refs = simplex_lattice(2, 2); // (1, 0), (0.5, 0.5), (0, 1)
        let a = associate(&[vec![2.0, 0.1], vec![1.0, 1.2], vec![0.0, 3.0]], &refs);
        assert_eq!(a.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!((a[0].1 - 0.1).abs() < 1e-12);
        assert!((a[1].1 - 0.2f64 / 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(a[2].1, 0.0);
    }

    #[test]
    fn niching_fills_the_emptiest_lines_first_with_their_closest_member() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        // The elite holds two on line 0 and one on line 1; line 2 is empty.
        let elite = [(0, 0.1), (0, 0.2), (1, 0.1)];
        let front = [(0, 0.0), (2, 0.5), (2, 0.3), (1, 0.4)];
        // Line 2 first, its closer member (2); then lines 1 and 2 have one
        // each: either 3 or 1 next.
        let two = niche_select(2, &elite, &front, 3, &mut rng);
        assert_eq!(two[0], 2);
        assert!(two[1] == 3 || two[1] == 1, "{two:?}");
        assert_eq!(niche_select(1, &elite, &front, 3, &mut rng), vec![2]);
        let mut all = niche_select(9, &elite, &front, 3, &mut rng);
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3]);
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
