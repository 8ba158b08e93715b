use kernels::{Backend, CpuBackend, Gemm, at, at_mut};
use std::time::Instant;
fn main() {
    let b = CpuBackend::new();
    let threads: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2);
    let mut ctx = b.new_ctx(threads).unwrap();
    let shapes = [
        ("u0 fwd", 65536, 32, 75, false, false),
        ("u0 dW", 75, 32, 65536, true, false),
        ("u1 fwd", 16384, 32, 800, false, false),
        ("u1 dW", 800, 32, 16384, true, false),
        ("u1 dcols", 16384, 800, 32, false, true),
        ("u2 fwd", 4096, 64, 800, false, false),
        ("u2 dW", 800, 64, 4096, true, false),
        ("u2 dcols", 4096, 800, 64, false, true),
    ];
    let mut total = 0.0;
    for (name, m, n, k, ta, tb) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) * 0.1).collect();
        let bb: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32) * 0.1).collect();
        let mut ab = b.alloc_zeroed(m * k).unwrap();
        let mut bbuf = b.alloc_zeroed(k * n).unwrap();
        let mut c = b.alloc_zeroed(m * n).unwrap();
        b.upload(&mut ctx, &a, at_mut(&mut ab, 0)).unwrap();
        b.upload(&mut ctx, &bb, at_mut(&mut bbuf, 0)).unwrap();
        let mut g = Gemm::new(m, n, k);
        if ta {
            g = g.trans_a();
        }
        if tb {
            g = g.trans_b();
        }
        let reps = 20;
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..reps {
                b.gemm(&mut ctx, &g, at(&ab, 0), at(&bbuf, 0), at_mut(&mut c, 0))
                    .unwrap();
            }
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        total += best;
        println!(
            "{name:9} {:7.2} ms {:6.1} GFLOP/s",
            best * 1e3,
            2.0 * (m * n * k) as f64 / best / 1e9
        );
    }
    println!("total {:.1} ms", total * 1e3);
}
