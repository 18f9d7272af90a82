// Megatron-LM arguments pasted into `tenplex model gpt`. A user copies the argument
// block of a pretrain_gpt.py command line; the model-shape arguments are options of
// `tenplex model gpt`, and everything CLI11 did not recognise comes here:
//   - arguments that change the model's tensors map onto GptArgs
//     (--bf16/--fp16: params dtype; --group-query-attention: query groups, 1 unless
//     --num-query-groups says otherwise; --use-rotary-position-embeddings: rope;
//     --seq-length: max positions when --max-position-embeddings is not given);
//   - training arguments that do not change the state's layout (batch sizes,
//     learning rate, parallel sizes, data and checkpoint paths, fusions, ...) are
//     accepted and ignored;
//   - arguments that would add tensors we do not describe (--num-experts,
//     --qk-layernorm, --add-qkv-bias) and unknown arguments are InvalidArgument,
//     listed in the order given.
#pragma once

#include <string>
#include <vector>

#include "tenplex/model/gpt.h"
#include "tenplex/util/status.h"

namespace tenplex::cli {

struct MegatronExtras {
  std::vector<std::string> ignored;  // training arguments accepted without effect
  bool max_positions_from_seq = false;
};

// Applies `extras` (CLI11's unparsed arguments, in order) to args. `explicit_flags`
// are the options given by name (an explicit --params-dtype wins over --bf16,
// --max-position-embeddings over --seq-length, --num-query-groups over
// --group-query-attention).
Result<MegatronExtras> ApplyMegatronArgs(const std::vector<std::string>& extras,
                                         const std::vector<std::string>& explicit_flags,
                                         GptArgs* args);

}  // namespace tenplex::cli
