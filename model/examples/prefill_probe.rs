//! Times the grouped prefill on 1 and 2 threads (a profiling aid).
use half::bf16;
use moek_kernels::Shape;
use moek_kernels::ir::Op;
use moek_kernels::testing::Case;
fn main() {
    let shape = Shape {
        t: 512,
        r: 8,
        e: 128,
        h: 2816,
        f: 704,
        v: 0,
    };
    let case = Case::<bf16>::new(Op::ExpertFfn, shape, 1);
    let f = moek_kernels::specs::prefill_expert_ffn_grouped::entry()
        .cpu
        .bf16
        .unwrap();
    let mut out = vec![0f32; 512 * 2816];
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut best = f64::MAX;
        for _ in 0..8 {
            let s = std::time::Instant::now();
            pool.install(|| f(&shape, &case.inputs(), &mut out));
            best = best.min(s.elapsed().as_secs_f64());
        }
        println!(
            "{threads} threads: {:.1} ms, {:.1} GFLOP/s",
            best * 1e3,
            48.7e9 / best / 1e9
        );
    }
}
