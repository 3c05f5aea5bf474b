//! The built-in specs: the optimised decode and prefill variants at the 26B-A4B and Qwen3-30B-A3B
//! geometries, and the general variants that serve any size and dtype. Each reads like a schedule card; docs/dsl.md
//! documents every key. [`entries`] (generated) lists them in declaration order, the ranks
//! `Registry::builtin` gives them.

use crate::kernel;

kernel! {
    /// Decode gate/up for one token and its eight routes. Each expert bank is cut into four
    /// 704-term blocks of H before selection; partial products are added in block order (this
    /// changes rounding versus one 2816-term dot product). Eight route owners.
    pub decode_gate_up_h704x4 = gate_up {
        dims:     T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:   f16, bf16;
        targets:  cpu, wgpu, spyre;
        select:   gather E by R;
        reduce:   H = 704 x 4;
        cores:    R = 8;
        requires: indexed_selection_layout;
    }

    /// Decode down for one token and its eight routes: output columns cut 1024/1024/768 before
    /// selection, each with the full 704-term reduction; the route-weighted K-axis combine adds
    /// the eight routes in route order.
    pub decode_down_cols_1024_1024_768 = down {
        dims:     T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:   f16, bf16;
        targets:  cpu, wgpu, spyre;
        select:   gather E by R;
        columns:  H = [1024, 1024, 768];
        cores:    R = 8;
        requires: indexed_selection_layout;
    }

    /// Decode expert FFN with both blockings: gate/up in 4 x 704 H blocks, down in
    /// 1024/1024/768 column blocks, eight route owners in both phases.
    pub decode_expert_ffn_blocked = expert_ffn {
        dims:            T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:          f16, bf16;
        targets:         cpu, wgpu, spyre;
        select:          gather E by R;
        reduce:          H = 704 x 4;
        columns:         H = [1024, 1024, 768];
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// The blocked decode expert FFN with SiLU experts (`silu(g) * u`, as Qwen3-MoE, Mixtral
    /// and DeepSeek experts compute), at the same geometry: the activation is data, so the
    /// schedule and every backend's variant are the blocked one's with one function swapped.
    pub decode_expert_ffn_blocked_silu = expert_ffn {
        dims:            T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:          f16, bf16;
        targets:         cpu, wgpu, spyre;
        activation:      silu;
        select:          gather E by R;
        reduce:          H = 704 x 4;
        columns:         H = [1024, 1024, 768];
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// The blocked decode expert FFN with gpt-oss's clamped SwiGLU (limit 7, alpha 1.702): on
    /// Spyre the pair is one SFU op with the two parameters, as for the other activations.
    pub decode_expert_ffn_blocked_swiglu = expert_ffn {
        dims:            T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:          f16, bf16;
        targets:         cpu, wgpu, spyre;
        activation:      swiglu_clamped(limit = 7.0, alpha = 1.702);
        select:          gather E by R;
        reduce:          H = 704 x 4;
        columns:         H = [1024, 1024, 768];
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// Decode expert FFN with the gate/up blocking alone.
    pub decode_expert_ffn_gate_up_blocked = expert_ffn {
        dims:            T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:          f16, bf16;
        targets:         cpu, wgpu, spyre;
        select:          gather E by R;
        reduce:          H = 704 x 4;
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// Decode expert FFN with the down column blocking alone.
    pub decode_expert_ffn_down_blocked = expert_ffn {
        dims:            T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:          f16, bf16;
        targets:         cpu, wgpu, spyre;
        select:          gather E by R;
        columns:         H = [1024, 1024, 768];
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// Prefill: all 128 experts densely over 512 tokens in one persistent loop; x and the
    /// accumulator stay resident, weights advance one expert bank per trip. Gate/up splits
    /// T x H = 8 x 4 (H partial sums completed across cores), down T x H = 16 x 2 (column halves),
    /// 32 token groups own x and the accumulator.
    pub prefill_expert_ffn_persistent = expert_ffn {
        dims:            T = 512, R = 8, E = 128, H = 2816, F = 704;
        dtypes:          f16, bf16;
        targets:         cpu, wgpu, spyre;
        select:          dense E;
        loop:            E persistent;
        groups:          T = 32;
        cores(gate_up):  T x H = 8 x 4;
        cores(down):     T x H = 16 x 2;
        requires:        lx_completed_sum;
    }

    /// Decode expert FFN, ordinary: gathered routes, no blocking, eight route owners, no
    /// capability required (what a backend without the indexed-selection layout runs).
    pub decode_expert_ffn_ordinary = expert_ffn {
        dims:    T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:  f16, bf16;
        targets: cpu, wgpu, spyre;
        select:  gather E by R;
        cores:   R = 8;
    }

    /// Prefill on a CPU: tokens grouped by expert, one GEMM pair per expert bank (the weights are
    /// read once per prompt, in place). Any prompt of two tokens or more; decode takes the gather
    /// variants.
    pub prefill_expert_ffn_grouped = expert_ffn {
        dims:    T = 2.., R = 8, E = 128, H = 2816, F = 704;
        dtypes:  f16, bf16, f32;
        targets: cpu;
        select:  grouped E by R;
    }

    /// Qwen3-30B-A3B decode (H 2048, F 768, 128 SiLU experts, top-8): H in four 512-term
    /// blocks, down in two 1024-column halves, eight route owners in both phases.
    pub qwen3_decode_expert_ffn_blocked = expert_ffn {
        dims:            T = 1, R = 8, E = 128, H = 2048, F = 768;
        dtypes:          f16, bf16;
        targets:         cpu, wgpu, spyre;
        activation:      silu;
        select:          gather E by R;
        reduce:          H = 512 x 4;
        columns:         H = [1024, 1024];
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// Qwen3-30B-A3B prefill on Spyre's schedule: all 128 experts densely over 512 tokens in one
    /// persistent loop, the Gemma-4 prefill's cuts at this geometry.
    pub qwen3_prefill_expert_ffn_persistent = expert_ffn {
        dims:            T = 512, R = 8, E = 128, H = 2048, F = 768;
        dtypes:          f16, bf16;
        targets:         cpu, wgpu, spyre;
        activation:      silu;
        select:          dense E;
        loop:            E persistent;
        groups:          T = 32;
        cores(gate_up):  T x H = 8 x 4;
        cores(down):     T x H = 16 x 2;
        requires:        lx_completed_sum;
    }

    /// Qwen3-30B-A3B prefill on a CPU: tokens grouped by expert, one GEMM pair per expert bank.
    pub qwen3_prefill_expert_ffn_grouped = expert_ffn {
        dims:       T = 2.., R = 8, E = 128, H = 2048, F = 768;
        dtypes:     f16, bf16, f32;
        targets:    cpu;
        activation: silu;
        select:     grouped E by R;
    }

    /// General decode fallback: gathered routes, unblocked, any size and dtype; routes are the
    /// work units (eight of them: fewer routes leave units empty).
    pub general_expert_ffn_gather = expert_ffn {
        dims:    T, R, E, H, F;
        dtypes:  f16, bf16, f32;
        targets: cpu, wgpu;
        select:  gather E by R;
        cores:   R = 8;
    }

    /// General prefill fallback: tokens grouped by expert, unblocked, any size and dtype.
    pub general_expert_ffn_grouped = expert_ffn {
        dims:    T = 2.., R, E, H, F;
        dtypes:  f16, bf16, f32;
        targets: cpu;
        select:  grouped E by R;
    }

    /// The general decode fallback with SiLU experts (Qwen3-MoE, Mixtral, DeepSeek): the same
    /// schedule, the activation swapped.
    pub general_expert_ffn_gather_silu = expert_ffn {
        dims:       T, R, E, H, F;
        dtypes:     f16, bf16, f32;
        targets:    cpu, wgpu;
        activation: silu;
        select:     gather E by R;
        cores:      R = 8;
    }

    /// The blocked expert FFN with Q8_0 or Q4_0 expert weights (f32 or bf16 activations) at the
    /// 26B-A4B's H and F, any E and T: the blocked decode schedule (H in 4 x 704, down in
    /// 1024/1024/768 columns, eight route owners), each product on the CPU an integer dot over
    /// 32-value blocks, on wgpu the blocks dequantized exactly. 704 is 22 blocks, so every
    /// reduction block is whole blocks.
    pub expert_ffn_blocked_quantized = expert_ffn {
        dims:            T, R = 8, E, H = 2816, F = 704;
        dtypes:          q8_0, q4_0, q8_0_bf16, q4_0_bf16;
        targets:         cpu, wgpu;
        select:          gather E by R;
        reduce:          H = 704 x 4;
        columns:         H = [1024, 1024, 768];
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// The blocked quantized expert FFN with a declared block size: 64 values under one f16
    /// scale (Q8_0 8.25 bits a weight, Q4_0 4.25, against 8.5 and 4.5 at 32), the largest
    /// block that divides the 26B-A4B's F = 704 (11 blocks; H = 2816 is 44). Each product on
    /// the CPU is still an integer dot per group of 32, the two groups of a block sharing its
    /// scale.
    pub expert_ffn_blocked_quantized_b64 = expert_ffn {
        dims:            T, R = 8, E, H = 2816, F = 704;
        dtypes:          q8_0, q4_0;
        targets:         cpu, wgpu;
        quant_block:     64;
        select:          gather E by R;
        reduce:          H = 704 x 4;
        columns:         H = [1024, 1024, 768];
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// Prefill with Q8_0 or Q4_0 experts at the 26B-A4B's geometry: tokens grouped by expert,
    /// each expert's rows dequantized, a panel at a time, into L1 for the GEMM tiles (exactly
    /// into f32, or rounded to bf16 for the `vdpbf16ps` tile: docs/quantization.md), against
    /// the activations as they are (nothing rounded to 8 bits, unlike the row products of
    /// decode). An expert's dequantized rows serve all its tokens, where the gathered
    /// products multiply every row once per token.
    pub prefill_expert_ffn_grouped_quantized = expert_ffn {
        dims:    T = 2.., R = 8, E = 128, H = 2816, F = 704;
        dtypes:  q8_0, q4_0, q8_0_bf16, q4_0_bf16;
        targets: cpu;
        select:  grouped E by R;
    }

    /// [`prefill_expert_ffn_grouped_quantized`] at any size, any block format.
    pub general_expert_ffn_grouped_quantized = expert_ffn {
        dims:    T = 2.., R, E, H, F;
        dtypes:  q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16;
        targets: cpu;
        select:  grouped E by R;
    }

    /// [`general_expert_ffn_grouped_quantized`] with SiLU experts (Qwen3-MoE, Mixtral,
    /// DeepSeek).
    pub general_expert_ffn_grouped_quantized_silu = expert_ffn {
        dims:       T = 2.., R, E, H, F;
        dtypes:     q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16;
        targets:    cpu;
        activation: silu;
        select:     grouped E by R;
    }

    /// The general expert FFN for quantized expert weights, any size whose rows are whole
    /// blocks of 32 (Q8_0, Q4_0 beside f32 or bf16 activations; MXFP4 beside f32).
    pub general_expert_ffn_gather_quantized = expert_ffn {
        dims:       T, R, E, H, F;
        dtypes:     q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16;
        targets:    cpu, wgpu;
        select:     gather E by R;
        cores:      R = 8;
    }

    /// A dense MLP stored in quantized blocks, as one expert that every token routes to with
    /// weight 1 (its gate and up rows one bank, `[1, 2F, H]`): the dense layers of a model
    /// quantized whole. Work is cut along the products' outputs (F for gate/up, H for down),
    /// there being one route to cut.
    pub dense_mlp_quantized = expert_ffn {
        dims:            T, R = 1, E = 1, H, F;
        dtypes:          q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16;
        targets:         cpu, wgpu;
        select:          gather E by R;
        cores(gate_up):  F = 32;
        cores(down):     H = 32;
    }

    /// [`dense_mlp_quantized`] with SiLU (Qwen3-MoE's dense layers).
    pub dense_mlp_quantized_silu = expert_ffn {
        dims:            T, R = 1, E = 1, H, F;
        dtypes:          q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16;
        targets:         cpu, wgpu;
        activation:      silu;
        select:          gather E by R;
        cores(gate_up):  F = 32;
        cores(down):     H = 32;
    }

    /// [`dense_mlp_quantized`] in prefill on the CPU (4 tokens or more): the one expert as a
    /// persistent loop of one trip, gate/up and down as GEMMs over the blocks (a panel of rows
    /// dequantized into L1 at a time serves every token, where the gathered products multiply
    /// each block once per token), cut along F and H as [`dense_mlp_quantized`] is.
    pub dense_mlp_quantized_prefill = expert_ffn {
        dims:            T = 4.., R = 1, E = 1, H, F;
        dtypes:          q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16;
        targets:         cpu;
        select:          dense E;
        loop:            E persistent;
        groups:          T = 32;
        cores(gate_up):  F = 32;
        cores(down):     H = 32;
    }

    /// [`dense_mlp_quantized_prefill`] with SiLU (Qwen3-MoE's dense layers).
    pub dense_mlp_quantized_prefill_silu = expert_ffn {
        dims:            T = 4.., R = 1, E = 1, H, F;
        dtypes:          q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16;
        targets:         cpu;
        activation:      silu;
        select:          dense E;
        loop:            E persistent;
        groups:          T = 32;
        cores(gate_up):  F = 32;
        cores(down):     H = 32;
    }

    /// The general quantized expert FFN with SiLU experts (Qwen3-MoE, Mixtral, DeepSeek).
    pub general_expert_ffn_gather_quantized_silu = expert_ffn {
        dims:       T, R, E, H, F;
        dtypes:     q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16;
        targets:    cpu, wgpu;
        activation: silu;
        select:     gather E by R;
        cores:      R = 8;
    }

    /// The general decode fallback with gpt-oss's clamped SwiGLU experts: gate clamped above
    /// at the limit, up to +-limit, `g sigmoid(alpha g) (u + 1)`.
    pub general_expert_ffn_gather_swiglu = expert_ffn {
        dims:       T, R, E, H, F;
        dtypes:     f16, bf16, f32;
        targets:    cpu, wgpu;
        activation: swiglu_clamped(limit = 7.0, alpha = 1.702);
        select:     gather E by R;
        cores:      R = 8;
    }

    /// gpt-oss's experts whole: clamped SwiGLU and biases on gate/up and down, any size.
    pub general_expert_ffn_gather_swiglu_biased = expert_ffn {
        dims:       T, R, E, H, F;
        dtypes:     f16, bf16, f32;
        targets:    cpu, wgpu;
        activation: swiglu_clamped(limit = 7.0, alpha = 1.702);
        bias:       gate_up, down;
        select:     gather E by R;
        cores:      R = 8;
    }

    /// gpt-oss's experts as its checkpoints ship them: MXFP4 banks (32 e2m1 values under an
    /// e8m0 scale), biases in f32, clamped SwiGLU, any size; also Q8_0 and Q4_0 banks for a
    /// bf16 checkpoint quantized at load.
    pub general_expert_ffn_gather_swiglu_biased_quantized = expert_ffn {
        dims:       T, R, E, H, F;
        dtypes:     mxfp4, mxfp4_bf16, q8_0, q4_0;
        targets:    cpu, wgpu;
        activation: swiglu_clamped(limit = 7.0, alpha = 1.702);
        bias:       gate_up, down;
        select:     gather E by R;
        cores:      R = 8;
    }

    /// gpt-oss's prefill experts as its checkpoints ship them (MXFP4, or Q8_0 and Q4_0 from a
    /// bf16 checkpoint quantized at load): tokens grouped by expert, each expert's rows
    /// dequantized a panel at a time for the GEMM tiles, biases added to the products.
    pub general_expert_ffn_grouped_swiglu_biased_quantized = expert_ffn {
        dims:       T = 2.., R, E, H, F;
        dtypes:     mxfp4, mxfp4_bf16, q8_0, q4_0;
        targets:    cpu;
        activation: swiglu_clamped(limit = 7.0, alpha = 1.702);
        bias:       gate_up, down;
        select:     grouped E by R;
    }

    /// gpt-oss's prefill experts (bf16 or f32 checkpoints), any size: tokens grouped by expert,
    /// each expert's gate/up and down one GEMM each, biases added to the products.
    pub general_expert_ffn_grouped_swiglu_biased = expert_ffn {
        dims:       T = 2.., R, E, H, F;
        dtypes:     f16, bf16, f32;
        targets:    cpu;
        activation: swiglu_clamped(limit = 7.0, alpha = 1.702);
        bias:       gate_up, down;
        select:     grouped E by R;
    }

    /// gpt-oss-20b's decode experts (H 2880, 32 experts of width 2880, top 4) in MXFP4 as
    /// shipped, or bf16: four route owners, each a route's gate/up and down whole; H read in
    /// three 960-term blocks (30 MXFP4 blocks each), down in 1024/1024/832 columns.
    pub gpt_oss_decode_expert_ffn = expert_ffn {
        dims:            T = 1, R = 4, E = 32, H = 2880, F = 2880;
        dtypes:          mxfp4, mxfp4_bf16, bf16;
        targets:         cpu, wgpu;
        activation:      swiglu_clamped(limit = 7.0, alpha = 1.702);
        bias:            gate_up, down;
        select:          gather E by R;
        reduce:          H = 960 x 3;
        columns:         H = [1024, 1024, 832];
        cores(gate_up):  R = 4;
        cores(down):     R = 4;
        requires:        indexed_selection_layout;
    }

    /// The general prefill fallback with SiLU experts.
    pub general_expert_ffn_grouped_silu = expert_ffn {
        dims:       T = 2.., R, E, H, F;
        dtypes:     f16, bf16, f32;
        targets:    cpu;
        activation: silu;
        select:     grouped E by R;
    }

    /// General gate/up over gathered routes, unblocked.
    pub general_gate_up = gate_up {
        dims:    T, R, E, H, F;
        dtypes:  f16, bf16, f32;
        targets: cpu, wgpu;
        select:  gather E by R;
        cores:   R = 8;
    }

    /// General down over gathered routes with the K-axis combine, unblocked.
    pub general_down = down {
        dims:    T, R, E, H, F;
        dtypes:  f16, bf16, f32;
        targets: cpu, wgpu;
        select:  gather E by R;
        cores:   R = 8;
    }

    /// The shared dense MLP of every Gemma-4 layer, any size.
    pub general_dense_mlp = dense_mlp {
        dims:    T, H, F;
        dtypes:  f16, bf16, f32;
        targets: cpu, wgpu;
    }

    /// A dense SiLU MLP, any size (Qwen3-MoE's dense layers).
    pub general_dense_mlp_silu = dense_mlp {
        dims:       T, H, F;
        dtypes:     f16, bf16, f32;
        targets:    cpu, wgpu;
        activation: silu;
    }

    /// Shared experts with Qwen2-MoE's gate: the always-on experts are one dense SiLU MLP (S
    /// experts of width F are one of width S x F), each token's row scaled by
    /// `sigmoid(x . output_gate)` before it is added to the routed sum.
    pub general_shared_experts_gated = dense_mlp {
        dims:        T, H, F;
        dtypes:      f16, bf16, f32;
        targets:     cpu, wgpu;
        activation:  silu;
        output_gate: sigmoid;
    }

    /// The 26B-A4B dense MLP (F 2112): gate/up rows split over two cores' worth of units, down
    /// columns likewise.
    pub dense_mlp_26b = dense_mlp {
        dims:           T, H = 2816, F = 2112;
        dtypes:         f16, bf16;
        targets:        cpu, wgpu;
        cores(gate_up): F = 32;
        cores(down):    H = 32;
    }

    /// The LM head on the final hidden row only, any vocabulary: softcap, then argmax.
    pub general_lm_head_row = lm_head_row {
        dims:    T, H, V;
        dtypes:  f16, bf16, f32;
        targets: cpu, wgpu;
        cores:   V = 32;
    }

    /// The LM head row over an embedding in Q8_0 or Q4_0 blocks (f32 or bf16 hidden row) or
    /// MXFP4 (f32): 32 vocabulary slices, each row on the CPU an integer dot over 32-value
    /// blocks (MXFP4: exact values into the f32 row).
    pub general_lm_head_row_quantized = lm_head_row {
        dims:    T, H, V;
        dtypes:  q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16;
        targets: cpu, wgpu;
        cores:   V = 32;
    }
}
