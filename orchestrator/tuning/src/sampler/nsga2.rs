//! NSGA-II (Deb et al. 2002) and NSGA-III (Deb and Jain 2014) for studies
//! of several objectives, with the operators Optuna's `NSGAIISampler` and
//! `NSGAIIISampler` use by default. The two differ only in how the last
//! front that does not fit whole into the parents is thinned: NSGA-II
//! keeps its least crowded members, NSGA-III its members on the reference
//! lines the parents cover least ([`pareto::niche_select`]), which keeps a
//! front of three or more objectives spread where crowding distance no
//! longer tells its points apart.
//!
//! Trials are numbered into generations of `population` trials in the
//! order the history lists them (creation order). The first generation
//! takes scrambled Sobol points ([`QmcSampler`]), which spread the first
//! parents more evenly than Optuna's random draws. Each later one breeds
//! from a parent population: the elite of the previous parents and the
//! previous generation's finished trials, by non-dominated rank and then
//! crowding distance ([`pareto::sort_fronts`], [`pareto::crowding`]).
//! With probability `crossover_prob` a child takes two distinct parents by
//! Deb's crowded tournament (of two, the lower rank, then the larger
//! crowding distance; Optuna's tournament looks at dominance only) and
//! each parameter from either with probability one half (uniform
//! crossover); otherwise it copies a parent taken at random. Then each
//! parameter is dropped with probability `1 / parameters` (mutation) and,
//! like any parameter the parents lack (a condition that did not hold for
//! them), drawn at random. A child that repeats a configuration already
//! in the history is bred again (up to 32 times).
//!
//! With constraints, dominance is Deb's rule
//! ([`pareto::constrained_dominates`]): feasible trials first, then the
//! smaller violation, as Optuna's NSGA-II ranks them.
//!
//! Everything is recomputed from the history at each proposal, and the
//! random stream is a function of the seed and the history's length: a
//! resumed study, or another process with the same history, proposes the
//! same. Trials still running when their generation is used are left out.

use rand::{RngExt, rngs::StdRng};

use super::random::draw;
use super::{QmcSampler, Sampler, TrialRecord, proposal_rng};
use crate::objective::Direction;
use crate::pareto;
use crate::space::{Params, SearchSpace};

/// Optuna's defaults.
pub const POPULATION: usize = 50;
pub const CROSSOVER_PROB: f64 = 0.9;
pub const SWAPPING_PROB: f64 = 0.5;

/// NSGA-III's reference points: Optuna's default divisions of the simplex.
pub const NSGA3_DIVISIONS: usize = 3;

/// How the last front that does not fit whole is thinned.
enum Survival {
    /// NSGA-II: by crowding distance.
    Crowding,
    /// NSGA-III: by niche, around these reference points.
    Niches(Vec<Vec<f64>>),
}

pub struct Nsga2Sampler {
    seed: u64,
    directions: Vec<Direction>,
    population: usize,
    survival: Survival,
}

impl Nsga2Sampler {
    pub fn new(seed: u64, directions: Vec<Direction>) -> Self {
        Self::with_population(seed, directions, POPULATION)
    }

    pub fn with_population(seed: u64, directions: Vec<Direction>, population: usize) -> Self {
        Nsga2Sampler {
            seed,
            directions,
            population: population.max(2),
            survival: Survival::Crowding,
        }
    }

    /// NSGA-III, around [`pareto::simplex_lattice`]'s reference points.
    pub fn nsga3(seed: u64, directions: Vec<Direction>, population: usize) -> Self {
        let references = pareto::simplex_lattice(directions.len(), NSGA3_DIVISIONS);
        Nsga2Sampler {
            survival: Survival::Niches(references),
            ..Self::with_population(seed, directions, population)
        }
    }

    /// The finished trials of `history[range]`, as (index, minimised values).
    fn finished(&self, history: &[TrialRecord], range: std::ops::Range<usize>) -> Vec<usize> {
        range
            .filter(|&i| history[i].values.len() == self.directions.len())
            .filter(|&i| history[i].values.iter().all(|v| v.is_finite()))
            .collect()
    }

    /// The parent population for generation `generation` (indices into
    /// `history`), by elite selection generation after generation.
    fn parents(&self, history: &[TrialRecord], generation: usize) -> Vec<usize> {
        let p = self.population;
        let mut parents: Vec<usize> = Vec::new();
        for g in 0..generation {
            let mut pool = parents.clone();
            pool.extend(self.finished(history, g * p..((g + 1) * p).min(history.len())));
            // NSGA-III's ties: a stream of the seed and the generation.
            let mut rng = proposal_rng(self.seed, g, 0x3a3);
            parents = self.elite(history, pool, &mut rng);
        }
        parents
    }

    /// The minimised values of `members` (indices into `history`) and
    /// their non-dominated fronts under Deb's constrained dominance, as
    /// positions in `members`.
    fn fronts(
        &self,
        history: &[TrialRecord],
        members: &[usize],
    ) -> (Vec<Vec<f64>>, Vec<Vec<usize>>) {
        let points: Vec<Vec<f64>> = members
            .iter()
            .map(|&i| pareto::minimised(&history[i].values, &self.directions))
            .collect();
        let violation = |k: usize| history[members[k]].violation;
        let fronts = pareto::sort_fronts_by(points.len(), |a, b| {
            pareto::constrained_dominates(&points[a], violation(a), &points[b], violation(b))
        });
        (points, fronts)
    }

    /// The best `population` of `pool`: whole fronts while they fit, then
    /// the most crowded-apart of the next (NSGA-II) or those on the least
    /// covered reference lines (NSGA-III).
    fn elite(&self, history: &[TrialRecord], pool: Vec<usize>, rng: &mut StdRng) -> Vec<usize> {
        let (points, fronts) = self.fronts(history, &pool);
        let mut chosen = Vec::new();
        for front in fronts {
            if chosen.len() + front.len() <= self.population {
                chosen.extend(front.iter().map(|&k| pool[k]));
                continue;
            }
            let room = self.population - chosen.len();
            let order: Vec<usize> = match &self.survival {
                Survival::Crowding => {
                    let members: Vec<&[f64]> =
                        front.iter().map(|&k| points[k].as_slice()).collect();
                    let distance = pareto::crowding(&members);
                    let mut order: Vec<usize> = (0..front.len()).collect();
                    order.sort_by(|&a, &b| distance[b].total_cmp(&distance[a]).then(a.cmp(&b)));
                    order.truncate(room);
                    order
                }
                Survival::Niches(references) => {
                    // Normalised over the elite so far and this front.
                    let chosen_points = chosen.len();
                    let members: Vec<Vec<f64>> = chosen
                        .iter()
                        .map(|&i| pareto::minimised(&history[i].values, &self.directions))
                        .chain(front.iter().map(|&k| points[k].clone()))
                        .collect();
                    let lines = pareto::associate(&pareto::normalise(&members), references);
                    let (elite, last) = lines.split_at(chosen_points);
                    pareto::niche_select(room, elite, last, references.len(), rng)
                }
            };
            chosen.extend(order.into_iter().map(|k| pool[front[k]]));
            break;
        }
        chosen
    }

    /// Each parent's standing: its non-dominated rank among the parents
    /// and its crowding distance within that front.
    fn standing(&self, history: &[TrialRecord], parents: &[usize]) -> Vec<(usize, f64)> {
        let (points, fronts) = self.fronts(history, parents);
        let mut standing = vec![(0, 0.0); parents.len()];
        for (rank, front) in fronts.iter().enumerate() {
            let members: Vec<&[f64]> = front.iter().map(|&k| points[k].as_slice()).collect();
            for (&k, d) in front.iter().zip(pareto::crowding(&members)) {
                standing[k] = (rank, d);
            }
        }
        standing
    }

    /// Deb's crowded binary tournament: of two random parents (positions
    /// in `parents`), the one of lower rank, then the less crowded, then
    /// the first.
    fn tournament(candidates: &[usize], standing: &[(usize, f64)], rng: &mut StdRng) -> usize {
        let a = candidates[rng.random_range(0..candidates.len())];
        let b = candidates[rng.random_range(0..candidates.len())];
        let ((ra, da), (rb, db)) = (standing[a], standing[b]);
        if rb < ra || (rb == ra && db > da) {
            b
        } else {
            a
        }
    }
}

impl Sampler for Nsga2Sampler {
    fn name(&self) -> &'static str {
        match self.survival {
            Survival::Crowding => "nsga2",
            Survival::Niches(_) => "nsga3",
        }
    }

    fn propose(&mut self, space: &SearchSpace, history: &[TrialRecord]) -> Option<Params> {
        let mut rng = proposal_rng(self.seed, history.len(), 0x45a2);
        let generation = history.len() / self.population;
        // The first generation fills the space evenly (scrambled Sobol
        // points) rather than at random: the parents of the second come
        // from a better spread of the front.
        let parents = if generation == 0 {
            Vec::new()
        } else {
            self.parents(history, generation)
        };
        let standing = self.standing(history, &parents);
        let mut child = if generation == 0 {
            QmcSampler { seed: self.seed }.propose(space, history)?
        } else {
            self.child(space, history, &parents, &standing, &mut rng)
        };
        // A child that repeats a trial already in the history (a copy of a
        // parent that no mutation touched, a crossover or a Sobol point
        // that lands on a tried configuration of a small discrete space)
        // would spend a trial to learn nothing: breed (or draw) again, up
        // to a bound.
        for _ in 0..REBREEDS {
            if !history.iter().any(|t| t.params == child) {
                break;
            }
            child = self.child(space, history, &parents, &standing, &mut rng);
        }
        Some(child)
    }
}

/// How many times a child that repeats a tried configuration is bred
/// again before it is proposed anyway (the space may be exhausted).
const REBREEDS: usize = 32;

impl Nsga2Sampler {
    /// One child of `parents` (random when there are fewer than two), by
    /// their `standing` ([`Nsga2Sampler::standing`]).
    fn child(
        &self,
        space: &SearchSpace,
        history: &[TrialRecord],
        parents: &[usize],
        standing: &[(usize, f64)],
        rng: &mut StdRng,
    ) -> Params {
        let inherited: Params = if parents.len() < 2 {
            Params::new()
        } else if rng.random::<f64>() < CROSSOVER_PROB {
            // Two distinct parents by tournament; each parameter from
            // either with probability one half.
            let all: Vec<usize> = (0..parents.len()).collect();
            let a = Self::tournament(&all, standing, rng);
            let rest: Vec<usize> = all.iter().copied().filter(|&k| k != a).collect();
            let b = Self::tournament(&rest, standing, rng);
            let (first, second) = (&history[parents[a]].params, &history[parents[b]].params);
            let mut child = Params::new();
            for (name, &v) in first {
                let from_second = rng.random::<f64>() < SWAPPING_PROB;
                match (from_second, second.get(name)) {
                    (true, Some(&w)) => child.insert(name.clone(), w),
                    _ => child.insert(name.clone(), v),
                };
            }
            child
        } else {
            // No crossover: a copy of a parent taken at random.
            history[parents[rng.random_range(0..parents.len())]]
                .params
                .clone()
        };
        let mutation = 1.0 / inherited.len().max(1) as f64;
        let mut inherited = inherited;
        inherited.retain(|_, _| rng.random::<f64>() >= mutation);
        // Active parameters in the space's order: inherited where the child
        // has a value that is still in range, else drawn at random.
        let mut params = Params::new();
        for p in space.params() {
            if !space.is_active(p, &params) {
                continue;
            }
            let v = match inherited.get(&p.name) {
                Some(&v) if p.dist.contains(v) => v,
                _ => draw(rng, &p.dist),
            };
            params.insert(p.name.clone(), v);
        }
        params
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::RandomSampler;
    use crate::space::{Distribution, Param, ParamValue};

    /// ZDT1 in `n` variables on [0, 1]: two objectives, both minimised,
    /// whose front is f2 = 1 - sqrt(f1).
    fn zdt1(p: &Params, n: usize) -> Vec<f64> {
        let x: Vec<f64> = (0..n)
            .map(|i| match p[&format!("x{i}")] {
                ParamValue::Float(v) => v,
                _ => unreachable!(),
            })
            .collect();
        let g = 1.0 + 9.0 * x[1..].iter().sum::<f64>() / (n - 1) as f64;
        vec![x[0], g * (1.0 - (x[0] / g).sqrt())]
    }

    fn space(n: usize) -> SearchSpace {
        SearchSpace::new(
            (0..n)
                .map(|i| Param {
                    name: format!("x{i}"),
                    dist: Distribution::Float {
                        low: 0.0,
                        high: 1.0,
                        log: false,
                        step: None,
                    },
                    condition: None,
                })
                .collect(),
        )
        .unwrap()
    }

    fn run(sampler: &mut dyn Sampler, trials: usize) -> Vec<TrialRecord> {
        let space = space(5);
        let mut h: Vec<TrialRecord> = Vec::new();
        for _ in 0..trials {
            let params = sampler.propose(&space, &h).unwrap();
            let values = zdt1(&params, 5);
            h.push(TrialRecord {
                params,
                value: Some(values[0]),
                values,
                violation: 0.0,
                stopped: None,
            });
        }
        h
    }

    fn hv(h: &[TrialRecord]) -> f64 {
        let pts: Vec<Vec<f64>> = h.iter().map(|t| t.values.clone()).collect();
        pareto::hypervolume(&pts, &[11.0, 11.0])
    }

    #[test]
    fn it_beats_random_search_on_zdt1_and_is_deterministic() {
        let dirs = vec![Direction::Minimize, Direction::Minimize];
        let mut wins = 0;
        for seed in 0..5 {
            let ours = hv(&run(
                &mut Nsga2Sampler::with_population(seed, dirs.clone(), 20),
                300,
            ));
            let random = hv(&run(&mut RandomSampler::new(seed), 300));
            wins += usize::from(ours > random);
        }
        assert!(wins >= 4, "NSGA-II beat random search in {wins} of 5 seeds");
        let a = run(&mut Nsga2Sampler::new(7, dirs.clone()), 120);
        let b = run(&mut Nsga2Sampler::new(7, dirs.clone()), 120);
        assert_eq!(a, b);
        // A resumed study (a fresh sampler, the same history) goes on alike.
        let next = Nsga2Sampler::new(7, dirs)
            .propose(&space(5), &a[..119])
            .unwrap();
        assert_eq!(next, a[119].params);
    }

    /// DTLZ2 in 7 variables: three objectives on the unit sphere's
    /// positive octant (plus the distance g of the last five from 0.5).
    fn dtlz2(p: &Params) -> Vec<f64> {
        let x: Vec<f64> = (0..7).map(|i| p[&format!("x{i}")].internal()).collect();
        let g: f64 = x[2..].iter().map(|v| (v - 0.5).powi(2)).sum();
        let (a, b) = (
            x[0] * std::f64::consts::FRAC_PI_2,
            x[1] * std::f64::consts::FRAC_PI_2,
        );
        vec![
            (1.0 + g) * a.cos() * b.cos(),
            (1.0 + g) * a.cos() * b.sin(),
            (1.0 + g) * a.sin(),
        ]
    }

    #[test]
    fn nsga3_closes_in_on_the_dtlz2_front_and_is_deterministic() {
        let dirs = vec![Direction::Minimize; 3];
        let space = space(7);
        let run = |s: &mut dyn Sampler| {
            let mut h: Vec<TrialRecord> = Vec::new();
            for _ in 0..200 {
                let params = s.propose(&space, &h).unwrap();
                let values = dtlz2(&params);
                h.push(TrialRecord {
                    params,
                    value: Some(values[0]),
                    values,
                    violation: 0.0,
                    stopped: None,
                });
            }
            h
        };
        // How far the last 100 trials are from the front (the unit
        // sphere), by their median: breeding closes in on it (to 0.54-0.6
        // of random search's gap for these seeds).
        let gap = |h: &[TrialRecord]| {
            let mut d: Vec<f64> = h[h.len() - 100..]
                .iter()
                .map(|t| t.values.iter().map(|v| v * v).sum::<f64>().sqrt() - 1.0)
                .collect();
            d.sort_by(f64::total_cmp);
            d[50]
        };
        for seed in 0..3 {
            let ours = gap(&run(&mut Nsga2Sampler::nsga3(seed, dirs.clone(), 20)));
            let random = gap(&run(&mut RandomSampler::new(seed)));
            assert!(
                ours < 0.75 * random,
                "seed {seed}: {ours} against random {random}"
            );
        }
        let mut a = Nsga2Sampler::nsga3(3, dirs.clone(), 20);
        assert_eq!(a.name(), "nsga3");
        assert_eq!(run(&mut a), run(&mut Nsga2Sampler::nsga3(3, dirs, 20)));
    }

    /// A finished trial of two objectives with no parameters.
    fn rec(a: f64, b: f64) -> TrialRecord {
        TrialRecord {
            params: Params::new(),
            value: Some(a),
            values: vec![a, b],
            violation: 0.0,
            stopped: None,
        }
    }

    #[test]
    fn nsga3_keeps_the_last_front_s_members_on_empty_reference_lines() {
        let s = Nsga2Sampler::nsga3(0, vec![Direction::Minimize; 2], 3);
        // One front of five, room for three and no parent yet: each pick
        // takes a reference line that has no member yet, so the three sit
        // on three lines.
        let h = vec![
            rec(0.0, 3.0),
            rec(0.9, 2.0),
            rec(1.0, 1.9),
            rec(2.0, 0.9),
            rec(3.0, 0.0),
        ];
        let lines = pareto::associate(
            &pareto::normalise(&h.iter().map(|t| t.values.clone()).collect::<Vec<_>>()),
            &pareto::simplex_lattice(2, NSGA3_DIVISIONS),
        );
        let mut e = s.elite(&h, (0..5).collect(), &mut proposal_rng(0, 0, 0));
        e.sort_unstable();
        let mut covered: Vec<usize> = e.iter().map(|&i| lines[i].0).collect();
        covered.sort_unstable();
        covered.dedup();
        assert_eq!(e.len(), 3);
        assert_eq!(
            covered.len(),
            3,
            "three members on three lines: {e:?} {lines:?}"
        );
    }

    #[test]
    fn the_elite_is_the_first_fronts_then_the_least_crowded() {
        let s = Nsga2Sampler::with_population(0, vec![Direction::Minimize; 2], 3);
        // Front 1: 0, 1, 2, 3 (four points, room for three); 4 is dominated.
        let h = vec![
            rec(0.0, 4.0),
            rec(1.0, 3.0),
            rec(1.1, 2.9),
            rec(4.0, 0.0),
            rec(5.0, 5.0),
        ];
        let mut e = s.elite(&h, (0..5).collect(), &mut proposal_rng(0, 0, 0));
        e.sort_unstable();
        // The extremes stay; of 1 and 2, the one with more room around it (2).
        assert_eq!(e, vec![0, 2, 3]);
    }

    #[test]
    fn the_tournament_prefers_the_lower_rank_then_the_less_crowded() {
        // Positions 0-2 with (rank, crowding): the pure comparison decides
        // whenever the two draws differ; a pair of equals keeps the first.
        let standing = [(1, f64::INFINITY), (0, 0.5), (0, 2.0)];
        let mut rng = proposal_rng(0, 0, 0);
        let mut wins = [0usize; 3];
        for _ in 0..300 {
            wins[Nsga2Sampler::tournament(&[0, 1, 2], &standing, &mut rng)] += 1;
        }
        // Position 2 wins every draw it is in (5 of 9 pairs), position 0
        // only against itself (1 of 9).
        assert!(wins[2] > wins[1] && wins[1] > wins[0], "{wins:?}");
        assert!(
            (wins[0] as f64 / 300.0 - 1.0 / 9.0).abs() < 0.06,
            "{wins:?}"
        );
        assert_eq!(
            Nsga2Sampler::tournament(&[1, 2], &[(0, 0.0), (0, 1.0), (0, 3.0)], &mut rng),
            2
        );
    }

    #[test]
    fn a_small_discrete_space_is_not_proposed_twice_until_it_is_exhausted() {
        let choice = |name: &str| Param {
            name: name.into(),
            dist: Distribution::Int {
                low: 0,
                high: 3,
                log: false,
                step: 1,
            },
            condition: None,
        };
        let space = SearchSpace::new(vec![choice("a"), choice("b")]).unwrap();
        // 16 configurations, a population of 4: every generation breeds
        // from the last. Each child is new while most are left; the last
        // few are found only by luck within the bound of rebreeds.
        let mut s = Nsga2Sampler::with_population(1, vec![Direction::Minimize; 2], 4);
        let mut h: Vec<TrialRecord> = Vec::new();
        for _ in 0..16 {
            let params = s.propose(&space, &h).unwrap();
            assert!(
                h.len() >= 12 || h.iter().all(|t| t.params != params),
                "trial {} repeats {params:?}",
                h.len()
            );
            let (a, b) = (params["a"].internal(), params["b"].internal());
            h.push(TrialRecord {
                params,
                value: Some(a),
                values: vec![a, 3.0 - a + b],
                violation: 0.0,
                stopped: None,
            });
        }
        let distinct = h
            .iter()
            .enumerate()
            .filter(|(i, t)| h[..*i].iter().all(|u| u.params != t.params))
            .count();
        assert!(distinct >= 14, "{distinct} distinct of 16");
        // Exhausted: a proposal still comes.
        for _ in 0..4 {
            let params = s.propose(&space, &h).unwrap();
            h.push(TrialRecord {
                params,
                value: Some(0.0),
                values: vec![0.0, 0.0],
                violation: 0.0,
                stopped: None,
            });
        }
    }
}
