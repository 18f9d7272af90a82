#include "tenplex/model/gpt.h"

namespace tenplex {
namespace {

struct Preset {
  const char* name;
  int layers;
  int64_t hidden, heads, groups, ffn, vocab, positions;
  bool llama;
};

// GPT-3 sizes from the GPT-3 paper (Table 2.1) with Megatron's head counts where the
// paper's heads do not divide the hidden size (1.3b: 16 heads of 128), vocabulary
// 50257 and 2048 positions. Llama sizes from the Llama 2 and Llama 3 papers.
constexpr Preset kPresets[] = {
    {"gpt3-125m", 12, 768, 12, 0, 0, 50257, 2048, false},
    {"gpt3-350m", 24, 1024, 16, 0, 0, 50257, 2048, false},
    {"gpt3-760m", 24, 1536, 16, 0, 0, 50257, 2048, false},
    {"gpt3-1.3b", 24, 2048, 16, 0, 0, 50257, 2048, false},
    {"gpt3-2.7b", 32, 2560, 32, 0, 0, 50257, 2048, false},
    {"gpt3-6.7b", 32, 4096, 32, 0, 0, 50257, 2048, false},
    {"gpt3-13b", 40, 5120, 40, 0, 0, 50257, 2048, false},
    {"gpt3-175b", 96, 12288, 96, 0, 0, 50257, 2048, false},
    {"llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, true},
    {"llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, true},
    {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, true},
};

Status Positive(int64_t v, const char* name) {
  if (v <= 0)
    return InvalidArgument(std::string(name) + " must be > 0 (got " + std::to_string(v) + ")");
  return Status::Ok();
}

}  // namespace

std::vector<std::string> GptPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

Result<GptArgs> GptPreset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    GptArgs a;
    a.name = p.name;
    a.num_layers = p.layers;
    a.hidden_size = p.hidden;
    a.num_attention_heads = p.heads;
    a.num_query_groups = p.groups;
    a.ffn_hidden_size = p.ffn;
    a.vocab_size = p.vocab;
    a.max_position_embeddings = p.positions;
    if (p.llama) {
      a.normalization = "RMSNorm";
      a.swiglu = true;
      a.position_embedding_type = "rope";
      a.untie_embeddings_and_output_weights = true;
      a.disable_bias_linear = true;
    }
    return a;
  }
  std::string known;
  for (const Preset& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.name;
  return InvalidArgument("unknown model preset '" + name + "' (known: " + known + ")");
}

namespace {

// The sizes MakeGpt derives from GptArgs, after checking them.
struct GptDims {
  int64_t h, heads, g, d, f, k;
  bool learned, layernorm, bias;
  DType dt;
};

Result<GptDims> CheckGptArgs(const GptArgs& a) {
  if (a.num_layers < 1) return InvalidArgument("--num-layers must be >= 1");
  TP_RETURN_IF_ERROR(Positive(a.hidden_size, "--hidden-size"));
  TP_RETURN_IF_ERROR(Positive(a.num_attention_heads, "--num-attention-heads"));
  TP_RETURN_IF_ERROR(Positive(a.vocab_size, "--vocab-size"));
  TP_RETURN_IF_ERROR(Positive(a.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by"));
  const int64_t h = a.hidden_size, heads = a.num_attention_heads;
  const int64_t g = a.num_query_groups ? a.num_query_groups : heads;
  TP_RETURN_IF_ERROR(Positive(g, "--num-query-groups"));
  if (heads % g != 0) {
    return InvalidArgument("--num-attention-heads (" + std::to_string(heads) +
                           ") must be a multiple of --num-query-groups (" + std::to_string(g) +
                           ")");
  }
  if (!a.kv_channels && h % heads != 0) {
    return InvalidArgument("--hidden-size (" + std::to_string(h) +
                           ") must be divisible by --num-attention-heads (" +
                           std::to_string(heads) + ") unless --kv-channels is given");
  }
  const int64_t d = a.kv_channels ? a.kv_channels : h / heads;
  TP_RETURN_IF_ERROR(Positive(d, "--kv-channels"));
  const int64_t f = a.ffn_hidden_size ? a.ffn_hidden_size : 4 * h;
  TP_RETURN_IF_ERROR(Positive(f, "--ffn-hidden-size"));
  const bool learned = a.position_embedding_type == "learned_absolute";
  if (!learned && a.position_embedding_type != "rope") {
    return InvalidArgument("--position-embedding-type must be learned_absolute or rope (got '" +
                           a.position_embedding_type + "')");
  }
  if (learned) TP_RETURN_IF_ERROR(Positive(a.max_position_embeddings, "--max-position-embeddings"));
  const bool layernorm = a.normalization == "LayerNorm";
  if (!layernorm && a.normalization != "RMSNorm") {
    return InvalidArgument("--normalization must be LayerNorm or RMSNorm (got '" + a.normalization +
                           "')");
  }
  DType dt;
  if (a.params_dtype == "fp32") {
    dt = DType::kF32;
  } else if (a.params_dtype == "bf16") {
    dt = DType::kBF16;
  } else if (a.params_dtype == "fp16") {
    dt = DType::kF16;
  } else {
    return InvalidArgument("--params-dtype must be fp32, bf16 or fp16 (got '" + a.params_dtype +
                           "')");
  }
  if (a.optimizer != "adam" && a.optimizer != "none") {
    return InvalidArgument("--optimizer must be adam or none (got '" + a.optimizer + "')");
  }
  const bool bias = !a.disable_bias_linear;
  const int64_t k = a.swiglu ? 2 : 1;

  return GptDims{h, heads, g, d, f, k, learned, layernorm, bias, dt};
}

// Megatron-core GPT parameter names, shapes and TP rules, in Megatron's order.
void AddGptTensors(const GptArgs& a, const GptDims& dims, Model& m) {
  // Plain copies, not a structured binding: the lambdas below capture them (clang 14
  // cannot capture structured bindings).
  const int64_t h = dims.h, heads = dims.heads, g = dims.g, d = dims.d, f = dims.f, k = dims.k;
  const bool learned = dims.learned, layernorm = dims.layernorm, bias = dims.bias;
  const DType dt = dims.dt;
  auto add = [&](std::string path, Shape shape, TpRule rule, Stage stage) {
    m.tensors.push_back({std::move(path), dt, std::move(shape), rule, stage});
  };
  const TpRule rep{};
  auto split = [](int dim, int64_t granule = 1, std::string gname = "") {
    TpRule r;
    r.kind = TpRule::kSplit;
    r.dim = dim;
    r.granule = granule;
    r.granule_name = std::move(gname);
    return r;
  };
  TpRule blocks;
  blocks.kind = TpRule::kBlocks;
  blocks.blocks = static_cast<int>(k);
  TpRule vocab;
  vocab.kind = TpRule::kVocab;
  vocab.divisible_by = a.make_vocab_size_divisible_by;
  const Stage first{Stage::kFirst, 0}, last{Stage::kLast, 0};

  add("embedding.word_embeddings.weight", {a.vocab_size, h}, vocab, first);
  if (learned)
    add("embedding.position_embeddings.weight", {a.max_position_embeddings, h}, rep, first);
  auto ln = [&](const std::string& prefix, Stage s) {
    add(prefix + "layer_norm_weight", {h}, rep, s);
    if (layernorm) add(prefix + "layer_norm_bias", {h}, rep, s);
  };
  const int64_t qkv_rows = (heads + 2 * g) * d;
  const int64_t group_rows = (heads / g + 2) * d;
  for (int i = 0; i < a.num_layers; ++i) {
    const std::string p = "decoder.layers." + std::to_string(i) + ".";
    const Stage s{Stage::kLayer, i};
    ln(p + "self_attention.linear_qkv.", s);
    add(p + "self_attention.linear_qkv.weight", {qkv_rows, h}, split(0, group_rows, "query groups"),
        s);
    if (bias)
      add(p + "self_attention.linear_qkv.bias", {qkv_rows}, split(0, group_rows, "query groups"),
          s);
    add(p + "self_attention.linear_proj.weight", {h, heads * d},
        split(1, heads / g * d, "query groups"), s);
    if (bias) add(p + "self_attention.linear_proj.bias", {h}, rep, s);
    ln(p + "mlp.linear_fc1.", s);
    add(p + "mlp.linear_fc1.weight", {k * f, h}, blocks, s);
    if (bias) add(p + "mlp.linear_fc1.bias", {k * f}, blocks, s);
    add(p + "mlp.linear_fc2.weight", {h, f}, split(1), s);
    if (bias) add(p + "mlp.linear_fc2.bias", {h}, rep, s);
  }
  add("decoder.final_layernorm.weight", {h}, rep, last);
  if (layernorm) add("decoder.final_layernorm.bias", {h}, rep, last);
  if (a.untie_embeddings_and_output_weights) {
    add("output_layer.weight", {a.vocab_size, h}, vocab, last);
  } else {
    m.aliases.push_back({"output_layer.weight", "embedding.word_embeddings.weight", last});
  }
}

std::map<std::string, std::string> GptInfo(const GptArgs& a, const GptDims& dims) {
  const int64_t h = dims.h, heads = dims.heads, g = dims.g, d = dims.d, f = dims.f;
  const bool bias = dims.bias;
  return {{"family", "gpt"},
          {"num_layers", std::to_string(a.num_layers)},
          {"hidden_size", std::to_string(h)},
          {"ffn_hidden_size", std::to_string(f)},
          {"num_attention_heads", std::to_string(heads)},
          {"num_query_groups", std::to_string(g)},
          {"kv_channels", std::to_string(d)},
          {"vocab_size", std::to_string(a.vocab_size)},
          {"make_vocab_size_divisible_by", std::to_string(a.make_vocab_size_divisible_by)},
          {"max_position_embeddings", std::to_string(a.max_position_embeddings)},
          {"position_embedding_type", a.position_embedding_type},
          {"swiglu", a.swiglu ? "true" : "false"},
          {"bias", bias ? "true" : "false"},
          {"tied", a.untie_embeddings_and_output_weights ? "false" : "true"},
          {"normalization", a.normalization},
          {"params_dtype", a.params_dtype}};
}

}  // namespace

Result<Model> MakeGpt(const GptArgs& a) {
  TP_ASSIGN_OR_RETURN(GptDims dims, CheckGptArgs(a));
  Model m;
  m.name = a.name;
  m.num_layers = a.num_layers;
  m.layer_prefix = "decoder.layers.";
  AddGptTensors(a, dims, m);
  if (a.optimizer == "adam") {
    m.optimizer.type = "adam";
    m.optimizer.states = {"exp_avg", "exp_avg_sq"};
  }
  m.info = GptInfo(a, dims);
  TP_RETURN_IF_ERROR(Validate(m));
  return m;
}

}  // namespace tenplex
