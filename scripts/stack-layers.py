#!/usr/bin/env python3
"""Writes an N-layer Gemma-4 GGUF by repeating the layers of a 2-layer one (llama.cpp's side).

The peer kit makes the synthetic 26B-A4B in bf16 through transformers, which at 30 layers needs
about 50 GB twice over. Speed does not depend on the weights' values, so the 30-layer model for
`scripts/side-by-side` is stacked from the 2-layer quantized file instead: every sliding layer a
copy of layer 0, every full layer a copy of layer 1, in the layout moek's geometry uses (full
where (i + 1) % 6 == 0 and last). Needs llama.cpp's gguf-py on PYTHONPATH.

    stack-layers.py IN_2L.gguf OUT.gguf --layers 30
"""

import argparse

import gguf


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--layers", type=int, default=30)
    a = p.parse_args()
    n = a.layers
    r = gguf.GGUFReader(a.input)
    arch = r.get_field("general.architecture").contents()
    full = [(i + 1) % 6 == 0 or i + 1 == n for i in range(n)]
    src = [1 if f else 0 for f in full]

    def per_layer(value):
        return [value[s] for s in src]

    w = gguf.GGUFWriter(a.output, arch)
    for field in r.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == f"{arch}.block_count":
            value = n
        elif field.name == f"{arch}.attention.sliding_window_pattern":
            value = [not f for f in full]
        elif kind == gguf.GGUFValueType.ARRAY and isinstance(value, list) and len(value) == 2 \
                and not field.name.startswith("tokenizer."):
            value = per_layer(value)
        w.add_key_value(field.name, value, kind, sub_type=sub)

    tensors = [(t.name, t) for t in r.tensors if not t.name.startswith("blk.")]
    for i in range(n):
        prefix = f"blk.{src[i]}."
        tensors += [
            (f"blk.{i}." + t.name[len(prefix):], t) for t in r.tensors if t.name.startswith(prefix)
        ]
    for name, t in tensors:
        w.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, t in tensors:
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()


if __name__ == "__main__":
    main()
