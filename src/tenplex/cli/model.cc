// tenplex model gpt [--preset NAME] [Megatron-LM arguments] [-o FILE]
#include "tenplex/cli/command.h"
#include "tenplex/cli/megatron_args.h"
#include "tenplex/model/gpt.h"
#include "tenplex/util/log.h"

namespace tenplex::cli {

namespace {

// Options a preset fills; without --preset the first four are required.
constexpr const char* kSizeFlags[] = {"--num-layers", "--hidden-size", "--num-attention-heads",
                                      "--vocab-size"};

// The options of `tenplex model gpt`.
struct GptOpts {
  GptArgs a;
  std::string preset, out;
  bool list = false;
};

// Megatron-LM's model-shape options (and --preset, --list-presets, -o) into *o.
void AddGptOptions(CLI::App* gpt, GptOpts* o) {
  gpt->add_option("--preset", o->preset,
                  "Well-known size (fills the size options): gpt3-125m ... gpt3-175b, "
                  "llama2-7b, llama2-13b, llama3-8b (--list-presets)");
  gpt->add_flag("--list-presets", o->list, "Print the preset names and exit");
  gpt->add_option("--num-layers", o->a.num_layers,
                  "Transformer layers (required without --preset)");
  gpt->add_option("--hidden-size", o->a.hidden_size, "Hidden size h (required without --preset)");
  gpt->add_option("--ffn-hidden-size", o->a.ffn_hidden_size, "MLP hidden size (default 4*h)");
  gpt->add_option("--num-attention-heads", o->a.num_attention_heads,
                  "Attention heads (required without --preset)");
  gpt->add_option("--num-query-groups", o->a.num_query_groups,
                  "Key/value groups for grouped-query attention (default: one per head)");
  gpt->add_option("--kv-channels", o->a.kv_channels, "Channels per head (default h/heads)");
  gpt->add_option("--vocab-size", o->a.vocab_size, "Vocabulary size V (required without --preset)");
  gpt->add_option("--make-vocab-size-divisible-by", o->a.make_vocab_size_divisible_by,
                  "Pad the vocabulary to a multiple of this times tp")
      ->capture_default_str();
  gpt->add_option("--max-position-embeddings", o->a.max_position_embeddings,
                  "Positions of the learned position embedding (default --seq-length, else 128)")
      ->capture_default_str();
  gpt->add_option("--position-embedding-type", o->a.position_embedding_type,
                  "learned_absolute or rope")
      ->check(CLI::IsMember({"learned_absolute", "rope"}))
      ->capture_default_str();
  gpt->add_flag("--swiglu", o->a.swiglu, "SwiGLU MLP (two fc1 halves)");
  gpt->add_flag("--disable-bias-linear", o->a.disable_bias_linear, "No biases in linear layers");
  gpt->add_flag("--untie-embeddings-and-output-weights", o->a.untie_embeddings_and_output_weights,
                "Separate output layer (default: tied to the word embeddings)");
  gpt->add_option("--normalization", o->a.normalization, "LayerNorm or RMSNorm")
      ->check(CLI::IsMember({"LayerNorm", "RMSNorm"}))
      ->capture_default_str();
  gpt->add_option("--params-dtype", o->a.params_dtype,
                  "fp32, bf16 or fp16 (--bf16/--fp16 set it too)")
      ->capture_default_str();
  gpt->add_option("--optimizer", o->a.optimizer,
                  "adam (exp_avg, exp_avg_sq, fp32 master copies) or none")
      ->capture_default_str();
  gpt->add_option("-o,--output", o->out, "Output file, written atomically (default stdout)");
}

// The model's arguments: the preset's (explicit flags override them; the preset fixes
// the positions and query groups, added to *explicit_flags) or the options given, which
// must then include the size flags.
Result<GptArgs> ResolveGptArgs(const GptOpts& opts, const CLI::App* gpt,
                               std::vector<std::string>* explicit_flags) {
  auto given = [&](const char* flag) { return gpt->count(flag) > 0; };
  GptArgs args = opts.a;
  if (!opts.preset.empty()) {
    auto p = GptPreset(opts.preset);
    if (!p.ok()) return p.status();
    // Explicit flags override the preset.
    args = *p;
    if (given("--num-layers")) args.num_layers = opts.a.num_layers;
    if (given("--hidden-size")) args.hidden_size = opts.a.hidden_size;
    if (given("--ffn-hidden-size")) args.ffn_hidden_size = opts.a.ffn_hidden_size;
    if (given("--num-attention-heads")) args.num_attention_heads = opts.a.num_attention_heads;
    if (given("--num-query-groups")) args.num_query_groups = opts.a.num_query_groups;
    if (given("--kv-channels")) args.kv_channels = opts.a.kv_channels;
    if (given("--vocab-size")) args.vocab_size = opts.a.vocab_size;
    if (given("--make-vocab-size-divisible-by"))
      args.make_vocab_size_divisible_by = opts.a.make_vocab_size_divisible_by;
    if (given("--max-position-embeddings"))
      args.max_position_embeddings = opts.a.max_position_embeddings;
    if (given("--position-embedding-type"))
      args.position_embedding_type = opts.a.position_embedding_type;
    if (given("--swiglu")) args.swiglu = true;
    if (given("--disable-bias-linear")) args.disable_bias_linear = true;
    if (given("--untie-embeddings-and-output-weights"))
      args.untie_embeddings_and_output_weights = true;
    if (given("--normalization")) args.normalization = opts.a.normalization;
    if (given("--params-dtype")) args.params_dtype = opts.a.params_dtype;
    if (given("--optimizer")) args.optimizer = opts.a.optimizer;
    // The preset fixes the positions and query groups.
    explicit_flags->push_back("--max-position-embeddings");
    explicit_flags->push_back("--num-query-groups");
  } else {
    std::string missing;
    for (const char* f : kSizeFlags) {
      if (!given(f)) missing += std::string(missing.empty() ? "" : ", ") + f;
    }
    if (!missing.empty()) {
      return InvalidArgument(
          "give --preset NAME (tenplex model gpt --list-presets) or the model size: missing " +
          missing);
    }
  }
  return args;
}

}  // namespace

void RegisterModel(CLI::App& app, Context& ctx) {
  auto* model = app.add_subcommand("model", "Write model descriptions (JSON)");
  model->require_subcommand(1);
  auto* gpt = model->add_subcommand(
      "gpt",
      "A GPT model with Megatron-Core parameter names. Give --preset NAME or the sizes "
      "(--num-layers, "
      "--hidden-size, --num-attention-heads, --vocab-size); other options have Megatron-LM's "
      "defaults. A pasted "
      "Megatron-LM argument block is accepted: --bf16/--fp16 set the params dtype, "
      "--group-query-attention and "
      "--use-rotary-position-embeddings shape the model, --seq-length is the default of "
      "--max-position-embeddings, and training arguments (batch sizes, learning rate, parallel "
      "sizes, paths) are "
      "ignored.");
  gpt->allow_extras();
  gpt->fallthrough(false);  // unknown arguments stay here (Megatron-LM arguments)
  auto o = std::make_shared<GptOpts>();
  AddGptOptions(gpt, o.get());
  gpt->callback([o, gpt, &ctx] {
    if (o->list) {
      std::string names;
      for (const auto& n : GptPresetNames()) names += n + "\n";
      Finish(ctx, WriteOutput("", names));
      return;
    }
    std::vector<std::string> explicit_flags;
    for (const char* f : {"--params-dtype", "--max-position-embeddings", "--num-query-groups"}) {
      if (gpt->count(f) > 0) explicit_flags.push_back(f);
    }
    Result<GptArgs> args = ResolveGptArgs(*o, gpt, &explicit_flags);
    if (!args.ok()) return Finish(ctx, args.status());
    auto extras = ApplyMegatronArgs(gpt->remaining(), explicit_flags, &*args);
    if (!extras.ok()) return Finish(ctx, extras.status());
    for (const std::string& a : extras->ignored)
      LogVerbose("model gpt: ignoring the training argument %s", a.c_str());
    auto m = MakeGpt(*args);
    if (!m.ok()) return Finish(ctx, m.status());
    Finish(ctx, WriteOutput(o->out, ModelToJson(*m)));
  });
}

}  // namespace tenplex::cli
