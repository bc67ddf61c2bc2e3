// Checkpoints: a model's parameters and its data-parallel optimizer state, saved as they lie on the
// ranks and loaded into any other mesh, strategy and precision.
//
//   checkpoint::save<Sharded>(root, model, dp, mesh, state, {.keep = 3});   every rank calls it
//   auto state = checkpoint::load(root, model, dp, mesh);                   root: latest, or a step
//
// What a rank saves. Each unit's flat buffer (nn/unit.hpp) is cut into data-parallel slices, one
// per data rank, whatever the strategy: data rank d saves elements [d S, (d + 1) S) of every unit
// it holds (S = padded / dp), which it holds under DDP, ZeRO and FSDP alike. A slice meets each
// parameter's entry in a contiguous range of the entry's tensor-parallel shard, which is a box of
// the global tensor (UnitEntry::box_offset, local): that (box, range) is one piece. Tensor-
// replicated parameters are saved by tensor rank 0 only, the tied table's copy on the last pipeline
// rank not at all: every global element is saved exactly once (check_coverage verifies it).
//
// Policies (a type, as the other policies are):
//   Sharded       every rank writes rank_<r>.safetensors with its pieces; nothing is gathered.
//   Consolidated  every rank sends its pieces to world rank 0, which writes model.safetensors with
//                 each tensor whole (its global shape); the manifest lists one piece per tensor.
// Both load the same way.
//
// A save, made durable step by step (files.hpp):
//   1. rank 0 creates <root>/step_<N>.tmp/; every rank copies its pieces to host memory (the only
//      part that waits for the device) and writes its file there, fsynced;
//   2. the ranks exchange their files' sizes and XXH3 hashes;
//   3. rank 0 fsyncs the directory, renames it to step_<N>, writes manifest.json into it (a
//      temporary name, fsync, rename), then moves <root>/latest to it, then removes what `keep`
//      lets go (save.hpp's pruned(): never the step just written nor latest's target; steps past
//      it, left by a run this one rolled back from, are kept), each renamed out of the checkpoints'
//      names before its files go.
// A save cut at any point leaves `latest` on the previous complete checkpoint, and every directory
// with a manifest complete; a directory without a manifest is refused by load(). A failure on any
// rank becomes the same Error on every rank, with its cause. World rank 0 holds the directory's
// lock (lock.hpp) from its first save: a second trainer there is refused.
//
// A load:
//   1. finds the checkpoint (<root>/latest, or a step directory), reads the manifest once per
//      process (its size and nesting bounded before parsing), validates every field (manifest.hpp),
//      compares the model's configuration record with the checkpoint's, and checks that every rank
//      reads the same manifest;
//   2. verifies every file (verify.hpp), the files divided among the ranks, the results shared: a
//      regular file, no link, of the listed size and hash, whose own piece records (pieces.hpp)
//      are the pieces the manifest places in it; every rank throws the same Error naming the file;
//      then checks that every tensor is covered exactly once;
//   3. fills what this rank holds (Holding: values, master weights, optimizer state) from the byte
//      ranges of the pieces that overlap it, converting dtypes where the precision changed:
//      values and master weights come from the saved master weights where there are any (mixed
//      precision), else from the saved values; so bf16 -> f32 continues from the f32 masters, and
//      f32 -> bf16 rounds once. Padding (rows of wte past the vocabulary, units' tail) is left as
//      the model initialized it: no result reads it.
//
// Headers: save.hpp and load.hpp (this one includes both), common.hpp (what they share),
// manifest.hpp (the format), pieces.hpp (the pieces each file records), verify.hpp (a load's checks,
// Reader), safetensors.hpp (the files), files.hpp (durable writes, hashes), lock.hpp (one trainer
// per save directory), gpt2.hpp (Hugging Face GPT-2 export and import).
#pragma once

#include "weft/checkpoint/load.hpp"
#include "weft/checkpoint/save.hpp"
