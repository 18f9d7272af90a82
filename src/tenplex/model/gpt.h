// The GPT model family with Megatron-Core parameter names (spec §2), from Megatron-LM's
// argument names or a preset.
#pragma once

#include <string>
#include <vector>

#include "tenplex/model/model.h"

namespace tenplex {

struct GptArgs {
  std::string name = "gpt";
  int num_layers = 2;
  int64_t hidden_size = 64;
  int64_t ffn_hidden_size = 0;  // 0: 4 * hidden_size
  int64_t num_attention_heads = 4;
  int64_t num_query_groups = 0;  // 0: num_attention_heads
  int64_t kv_channels = 0;       // 0: hidden_size / num_attention_heads
  int64_t vocab_size = 512;
  int64_t make_vocab_size_divisible_by = 128;
  int64_t max_position_embeddings = 128;
  std::string position_embedding_type = "learned_absolute";  // or "rope"
  bool swiglu = false;
  bool disable_bias_linear = false;
  bool untie_embeddings_and_output_weights = false;
  std::string normalization = "LayerNorm";  // or "RMSNorm"
  std::string params_dtype = "fp32";        // fp32, bf16, fp16
  std::string optimizer = "adam";           // adam or none
};

// Names of the presets, in a stable order.
std::vector<std::string> GptPresetNames();
// The arguments of a preset; unknown names are InvalidArgument listing the known ones.
Result<GptArgs> GptPreset(const std::string& name);
// Builds the description; inconsistent arguments are InvalidArgument naming the rule.
Result<Model> MakeGpt(const GptArgs& args);

}  // namespace tenplex
