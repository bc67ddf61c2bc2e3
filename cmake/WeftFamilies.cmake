# The model families weft's own programs ship (weft-train, weft-plan and weft-export in
# examples/CMakeLists.txt, and scripts/gpu-build's weft-train): a family `name` is its headers under
# include/weft/models/<name>/ (docs/training.md, "Shipping a family"). Adding a family to all of
# them is adding its name here.
set(WEFT_FAMILIES gpt2 llama)
