use kernels::*;
use std::time::Instant;
fn main() {
    let b = CpuBackend::new();
    let mut ctx = b.new_ctx(2).unwrap();
    for (h, c) in [(32usize, 32usize), (16, 32), (8, 64)] {
        let input = Images::packed(1, 64, h, h, c);
        let p = Pool2d {
            input,
            kind: PoolKind::Max,
            kh: 2,
            kw: 2,
            stride: 2,
        };
        let x: Vec<f32> = (0..input.len())
            .map(|i| ((i * 7919 % 1000) as f32) * 0.001 - 0.5)
            .collect();
        let mut xb = b.alloc_zeroed(x.len()).unwrap();
        b.upload(&mut ctx, &x, at_mut(&mut xb, 0)).unwrap();
        let mut y = b.alloc_zeroed(p.output().len()).unwrap();
        let mut dx = b.alloc_zeroed(x.len()).unwrap();
        let (mut tf, mut tb) = (f64::MAX, f64::MAX);
        for _ in 0..20 {
            let t = Instant::now();
            b.pool2d(&mut ctx, &p, at(&xb, 0), at_mut(&mut y, 0))
                .unwrap();
            tf = tf.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            b.pool2d_backward(&mut ctx, &p, at(&xb, 0), at(&y, 0), at_mut(&mut dx, 0))
                .unwrap();
            tb = tb.min(t.elapsed().as_secs_f64());
        }
        println!("{h}x{h}x{c}: fwd {:.3} ms bwd {:.3} ms", tf * 1e3, tb * 1e3);
    }
}
