// tenplex model gpt [Megatron-LM arguments] [-o FILE]
#include "tenplex/cli/command.h"
#include "tenplex/model/gpt.h"

namespace tenplex::cli {

void RegisterModel(CLI::App& app, Context& ctx) {
  auto* model = app.add_subcommand("model", "Write model descriptions (JSON)");
  model->require_subcommand(1);
  auto* gpt = model->add_subcommand("gpt", "A GPT model with Megatron-Core parameter names");
  struct Opts {
    GptArgs a;
    std::string preset, out;
    bool list = false;
  };
  auto o = std::make_shared<Opts>();
  gpt->add_option("--preset", o->preset, "Well-known size: gpt3-125m ... gpt3-175b, llama2-7b, llama3-8b");
  gpt->add_flag("--list-presets", o->list, "Print the preset names");
  gpt->add_option("--num-layers", o->a.num_layers);
  gpt->add_option("--hidden-size", o->a.hidden_size);
  gpt->add_option("--ffn-hidden-size", o->a.ffn_hidden_size, "default 4*hidden");
  gpt->add_option("--num-attention-heads", o->a.num_attention_heads);
  gpt->add_option("--num-query-groups", o->a.num_query_groups, "default num-attention-heads");
  gpt->add_option("--kv-channels", o->a.kv_channels, "default hidden/heads");
  gpt->add_option("--vocab-size", o->a.vocab_size);
  gpt->add_option("--make-vocab-size-divisible-by", o->a.make_vocab_size_divisible_by);
  gpt->add_option("--max-position-embeddings", o->a.max_position_embeddings);
  gpt->add_option("--position-embedding-type", o->a.position_embedding_type, "learned_absolute|rope");
  gpt->add_flag("--swiglu", o->a.swiglu);
  gpt->add_flag("--disable-bias-linear", o->a.disable_bias_linear);
  gpt->add_flag("--untie-embeddings-and-output-weights", o->a.untie_embeddings_and_output_weights);
  gpt->add_option("--normalization", o->a.normalization, "LayerNorm|RMSNorm");
  gpt->add_option("--params-dtype", o->a.params_dtype, "fp32|bf16|fp16");
  gpt->add_option("--optimizer", o->a.optimizer, "adam|none");
  gpt->add_option("-o,--output", o->out, "Output file (default stdout)");
  gpt->callback([o, gpt, &ctx] {
    if (o->list) {
      std::string names;
      for (const auto& n : GptPresetNames()) names += n + "\n";
      Finish(ctx, WriteOutput("", names));
      return;
    }
    GptArgs args = o->a;
    if (!o->preset.empty()) {
      auto p = GptPreset(o->preset);
      if (!p.ok()) return Finish(ctx, p.status());
      // Explicit flags override the preset.
      GptArgs defaults;
      args = *p;
      auto given = [&](const char* flag) { return gpt->count(flag) > 0; };
      if (given("--num-layers")) args.num_layers = o->a.num_layers;
      if (given("--hidden-size")) args.hidden_size = o->a.hidden_size;
      if (given("--ffn-hidden-size")) args.ffn_hidden_size = o->a.ffn_hidden_size;
      if (given("--num-attention-heads")) args.num_attention_heads = o->a.num_attention_heads;
      if (given("--num-query-groups")) args.num_query_groups = o->a.num_query_groups;
      if (given("--kv-channels")) args.kv_channels = o->a.kv_channels;
      if (given("--vocab-size")) args.vocab_size = o->a.vocab_size;
      if (given("--make-vocab-size-divisible-by")) args.make_vocab_size_divisible_by = o->a.make_vocab_size_divisible_by;
      if (given("--max-position-embeddings")) args.max_position_embeddings = o->a.max_position_embeddings;
      if (given("--position-embedding-type")) args.position_embedding_type = o->a.position_embedding_type;
      if (given("--swiglu")) args.swiglu = true;
      if (given("--disable-bias-linear")) args.disable_bias_linear = true;
      if (given("--untie-embeddings-and-output-weights")) args.untie_embeddings_and_output_weights = true;
      if (given("--normalization")) args.normalization = o->a.normalization;
      if (given("--params-dtype")) args.params_dtype = o->a.params_dtype;
      if (given("--optimizer")) args.optimizer = o->a.optimizer;
    }
    auto m = MakeGpt(args);
    if (!m.ok()) return Finish(ctx, m.status());
    Finish(ctx, WriteOutput(o->out, ModelToJson(*m)));
  });
}

}  // namespace tenplex::cli
