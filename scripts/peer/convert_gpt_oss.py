"""llama.cpp's convert_hf_to_gguf.py (from LLAMA_SRC) on make_gpt_oss.py's checkpoint: the
synthetic tokenizer's pre-tokenizer is named as gpt-oss's own (`gpt-4o`), which the converter
would otherwise refuse as unknown. The experts stay MXFP4 (the converter repacks the blocks)."""
import sys, os
sys.path.insert(0, os.environ["LLAMA_SRC"]); sys.path.insert(0, os.path.join(os.environ["LLAMA_SRC"], "gguf-py"))
import convert_hf_to_gguf as c
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-4o"
c.main()
