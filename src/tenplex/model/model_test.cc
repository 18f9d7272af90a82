#include "tenplex/model/model.h"

#include <gtest/gtest.h>

#include "tenplex/model/gpt.h"

namespace tenplex {
namespace {

TEST(GptTest, PresetsBuildWithExpectedSizes) {
  for (const std::string& name : GptPresetNames()) {
    auto a = GptPreset(name);
    ASSERT_TRUE(a.ok()) << name;
    auto m = MakeGpt(*a);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().ToString();
  }
  auto count = [](const std::string& preset) {
    Model m = *MakeGpt(*GptPreset(preset));
    int64_t n = 0;
    for (const TensorDesc& t : m.tensors) n += Volume(t.shape);
    return n;
  };
  // Parameter counts of the papers, within 2%.
  EXPECT_NEAR(count("gpt3-125m") / 1e6, 125, 2.5);
  EXPECT_NEAR(count("gpt3-350m") / 1e6, 356, 7);
  EXPECT_NEAR(count("gpt3-1.3b") / 1e9, 1.31, 0.03);
  EXPECT_NEAR(count("gpt3-175b") / 1e9, 175, 3.5);
  EXPECT_NEAR(count("llama2-7b") / 1e9, 6.74, 0.1);
  EXPECT_NEAR(count("llama3-8b") / 1e9, 8.03, 0.1);
  Model l3 = *MakeGpt(*GptPreset("llama3-8b"));
  // GQA: (32 + 2*8) * 128 rows; SwiGLU: 2 * 14336 rows; untied output; RMSNorm only.
  EXPECT_EQ(l3.tensors[l3.Find("decoder.layers.0.self_attention.linear_qkv.weight")].shape,
            (Shape{6144, 4096}));
  EXPECT_EQ(l3.tensors[l3.Find("decoder.layers.0.mlp.linear_fc1.weight")].shape,
            (Shape{28672, 4096}));
  EXPECT_GE(l3.Find("output_layer.weight"), 0);
  EXPECT_LT(l3.Find("decoder.final_layernorm.bias"), 0);
  EXPECT_LT(l3.Find("decoder.layers.0.self_attention.linear_qkv.bias"), 0);
  EXPECT_TRUE(l3.aliases.empty());
}

TEST(GptTest, SpecOrderAndRules) {
  GptArgs a;
  a.num_layers = 1;
  Model m = *MakeGpt(a);
  std::vector<std::string> names;
  for (const TensorDesc& t : m.tensors) names.push_back(t.path);
  std::vector<std::string> want = {"embedding.word_embeddings.weight",
                                   "embedding.position_embeddings.weight",
                                   "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
                                   "decoder.layers.0.self_attention.linear_qkv.layer_norm_bias",
                                   "decoder.layers.0.self_attention.linear_qkv.weight",
                                   "decoder.layers.0.self_attention.linear_qkv.bias",
                                   "decoder.layers.0.self_attention.linear_proj.weight",
                                   "decoder.layers.0.self_attention.linear_proj.bias",
                                   "decoder.layers.0.mlp.linear_fc1.layer_norm_weight",
                                   "decoder.layers.0.mlp.linear_fc1.layer_norm_bias",
                                   "decoder.layers.0.mlp.linear_fc1.weight",
                                   "decoder.layers.0.mlp.linear_fc1.bias",
                                   "decoder.layers.0.mlp.linear_fc2.weight",
                                   "decoder.layers.0.mlp.linear_fc2.bias",
                                   "decoder.final_layernorm.weight",
                                   "decoder.final_layernorm.bias"};
  EXPECT_EQ(names, want);
  ASSERT_EQ(m.aliases.size(), 1u);
  EXPECT_EQ(m.aliases[0].name, "output_layer.weight");
  // Companions: exp_avg, exp_avg_sq for each parameter (fp32 params: no fp32_param).
  EXPECT_EQ(GlobalTensors(m).size(), 3 * names.size());
  a.params_dtype = "bf16";
  Model b = *MakeGpt(a);
  EXPECT_EQ(GlobalTensors(b).size(), 4 * names.size());
  EXPECT_EQ(GlobalTensors(b).back().name, "optimizer.fp32_param.decoder.final_layernorm.bias");
}

TEST(GptTest, RejectsInconsistentArguments) {
  GptArgs a;
  a.num_query_groups = 3;  // 4 heads
  EXPECT_NE(MakeGpt(a).status().message().find("--num-query-groups"), std::string::npos);
  a = GptArgs();
  a.hidden_size = 10;  // 4 heads
  EXPECT_FALSE(MakeGpt(a).ok());
  a = GptArgs();
  a.normalization = "BatchNorm";
  EXPECT_FALSE(MakeGpt(a).ok());
  a = GptArgs();
  a.params_dtype = "fp8";
  EXPECT_FALSE(MakeGpt(a).ok());
  EXPECT_NE(GptPreset("gpt5").status().message().find("gpt3-175b"), std::string::npos);
}

TEST(ModelJsonTest, RoundTrip) {
  GptArgs a;
  a.swiglu = true;
  a.num_query_groups = 2;
  a.params_dtype = "bf16";
  Model m = *MakeGpt(a);
  std::string j = ModelToJson(m);
  auto back = ModelFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(ModelToJson(*back), j);
  EXPECT_EQ(back->tensors.size(), m.tensors.size());
  EXPECT_EQ(back->tensors[4].tp, m.tensors[4].tp);
}

TEST(ModelJsonTest, MalformedIsClearError) {
  struct Case {
    const char* json;
    const char* needle;
  } cases[] = {
      {"{", "not valid JSON"},
      {"[]", "JSON object"},
      {R"({"num_layers": 1})", "'tensors'"},
      {R"({"num_layers": "x", "tensors": []})", "num_layers"},
      {R"({"num_layers": 1, "tensors": []})", "no tensors"},
      {R"({"num_layers": 1, "tensors": [{"path": "a", "dtype": "F33", "shape": [2], "stage": "first"}]})",
       "F33"},
      {R"({"num_layers": 1, "tensors": [{"path": "a", "dtype": "F32", "shape": [-2], "stage": "first"}]})",
       "negative"},
      {R"({"num_layers": 1, "tensors": [{"path": "a", "dtype": "F32", "shape": [2], "stage": "middle"}]})",
       "stage"},
      {R"({"num_layers": 1, "tensors": [{"path": "a", "dtype": "F32", "shape": [2], "stage": {"layer": 5}}]})",
       "layer 5"},
      {R"({"num_layers": 1, "tensors": [{"path": "a", "dtype": "F32", "shape": [2], "stage": "first", "tp": {"rule": "split", "dim": 3}}]})",
       "tp dim"},
      {R"({"num_layers": 1, "tensors": [{"path": "a", "dtype": "F32", "shape": [2], "stage": "first", "tp": {"rule": "diagonal"}}]})",
       "diagonal"},
      {R"({"num_layers": 1, "tensors": [{"path": "a", "dtype": "F32", "shape": [2], "stage": "first"}, {"path": "a", "dtype": "F32", "shape": [2], "stage": "first"}]})",
       "duplicate"},
      {R"({"num_layers": 1, "tensors": [{"path": "a", "dtype": "F32", "shape": [2], "stage": "first"}], "aliases": [{"name": "b", "target": "zz", "stage": "last"}]})",
       "unknown tensor zz"},
      {R"({"num_layers": 1, "tensors": [{"path": "a", "dtype": "F32", "shape": [4611686018427387904, 4], "stage": "first"}]})",
       "overflows"},
      {R"({"format": "other", "num_layers": 1, "tensors": []})", "unknown model format"},
  };
  for (const Case& c : cases) {
    auto m = ModelFromJson(c.json);
    ASSERT_FALSE(m.ok()) << c.json;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(m.status().message().find(c.needle), std::string::npos)
        << c.json << " -> " << m.status().message();
  }
}

}  // namespace
}  // namespace tenplex
