use moek_kernels::ir::{Capability, DimName, Phase, Selection};
use moek_kernels::kernel;

kernel! {
    /// Every key at once.
    pub decode = expert_ffn {
        dims:            T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:          f16, bf16;
        targets:         cpu, spyre;
        select:          gather E by R;
        reduce:          H = 704 x 4, F = [320, 384];
        columns:         H = [1024, 1024, 768];
        cores(gate_up):  R x H = 8 x 4;
        cores(down):     R = 8;
        stream:          F = 64;
        requires:        indexed_selection_layout, read_copy_elision;
    }

    pub prefill = expert_ffn {
        dims:            T = 512, R = 8, E = 128, H = 2816, F = 704;
        dtypes:          bf16;
        targets:         cpu;
        select:          dense E;
        loop:            E persistent;
        groups:          T = 32;
        cores(gate_up):  T x H = 8 x 4;
        cores(down):     T x H = 16 x 2;
        requires:        lx_completed_sum;
    }
}

fn main() {
    let ir = decode::entry().ir().clone();
    assert_eq!(ir.doc, "Every key at once.");
    assert_eq!(ir.schedule.select, Selection::Gather);
    assert_eq!(ir.reduce_blocks(DimName::H).unwrap().sizes, vec![704; 4]);
    assert_eq!(ir.column_blocks(DimName::H).unwrap().sizes, vec![1024, 1024, 768]);
    assert_eq!(ir.cores_for(Phase::GateUp)[1].parts, 4);
    assert_eq!(ir.requires, vec![Capability::IndexedSelectionLayout, Capability::ReadCopyElision]);
    let p = prefill::entry().ir().clone();
    assert_eq!(p.schedule.persistent, Some(DimName::E));
    assert!(prefill::entry().cpu.f16.is_none(), "a dtype the spec does not declare has no variant");
}
