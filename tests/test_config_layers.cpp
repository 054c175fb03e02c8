// Composable configs: `include` of bases (relative to the including file, nested), several
// config files layered in order, --set on top, the provenance of each value, and the one-line
// refusals of include cycles and missing includes.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "expect_error.hpp"
#include "run_util.hpp"
#include "temp_dir.hpp"

namespace trident {
namespace {

using test::error_of;
using test::expect_one_line_with;

// A tree of config files: base/model.toml <- base/train.toml <- exp/lr.toml, exp/other.toml.
class ConfigLayers : public testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.file("base"));
    std::filesystem::create_directories(dir_.file("exp"));
    write("base/model.toml",
          "[model]\nlayers = 3\nwidth = 48\nheads = 4\n[data]\ntrain = \"data/train.bin\"\n");
    // A nested include, relative to base/ (not to the directory of the outermost file).
    write("base/train.toml",
          "include = [\"model.toml\"]\n[model]\nlayers = 4\n[optim]\nlr = 0.001\n"
          "[train]\nsteps = 50\n");
    write("exp/lr.toml", "include = [\"../base/train.toml\"]\n[optim]\nlr = 0.003\n");
    write("exp/other.toml", "[train]\nsteps = 70\n[optim]\nmin_lr = 0.0001\n");
  }
  void write(const std::string& name, const std::string& text) {
    test::write_file(dir_.file(name), text);
  }
  std::string path(const std::string& name) const { return dir_.file(name); }

  test::TempDir dir_{"trident_layers"};
};

TEST_F(ConfigLayers, PrecedenceBaseThenIncludingFileThenLaterFileThenSet) {
  const Config c = load_configs({path("exp/lr.toml"), path("exp/other.toml")},
                                {"train.steps=90"});
  EXPECT_EQ(c.model.width, 48);        // only the innermost base gives it
  EXPECT_EQ(c.model.layers, 4);        // base/train.toml over its base base/model.toml
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.003); // exp/lr.toml over its base
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 0.0001);  // the later file
  EXPECT_EQ(c.train.steps, 90);        // --set over every file (other.toml says 70)
  EXPECT_EQ(load_configs({path("exp/lr.toml"), path("exp/other.toml")}).train.steps, 70);
  // The order of the files decides: base/train.toml after exp/other.toml wins.
  EXPECT_EQ(load_configs({path("exp/other.toml"), path("base/train.toml")}).train.steps, 50);
  EXPECT_EQ(c.source, path("exp/lr.toml") + ", " + path("exp/other.toml"));
}

TEST_F(ConfigLayers, ProvenanceNamesTheFileOrOverrideThatSetEachKey) {
  const Config c = load_configs({path("exp/lr.toml"), path("exp/other.toml")},
                                {"train.steps=90"});
  EXPECT_EQ(c.provenance.at("model.width"), path("base/model.toml"));
  EXPECT_EQ(c.provenance.at("model.layers"), path("base/train.toml"));
  EXPECT_EQ(c.provenance.at("optim.lr"), path("exp/lr.toml"));
  EXPECT_EQ(c.provenance.at("optim.min_lr"), path("exp/other.toml"));
  EXPECT_EQ(c.provenance.at("train.steps"), "--set");
  EXPECT_EQ(c.provenance.count("train.seed"), 0u);  // a default

  const std::string text = c.to_toml_with_provenance();
  for (const std::string& line :
       {"width = 48  # from " + path("base/model.toml"),
        "layers = 4  # from " + path("base/train.toml"), "lr = 0.003  # from " + path("exp/lr.toml"),
        "min_lr = 0.0001  # from " + path("exp/other.toml"), std::string("steps = 90  # --set"),
        std::string("seed = 1234\n"), std::string("tie_embeddings = true\n")})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  // The annotated text is a config file that reads back to the same values.
  const Config again = parse_config(text, "resolved.toml");
  EXPECT_EQ(again.to_toml(), c.to_toml());
}

TEST_F(ConfigLayers, DerivedDefaultIsMarkedAsSuch) {
  write("llama.toml", "[model]\narch = \"llama\"\n[data]\ntrain = \"x.bin\"\n");
  const std::string text = load_config(path("llama.toml")).to_toml_with_provenance();
  EXPECT_NE(text.find("tie_embeddings = false  # derived from other keys\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("arch = \"llama\"  # from " + path("llama.toml")), std::string::npos);
}

TEST_F(ConfigLayers, IncludeIsRelativeToTheIncludingFileNotTheWorkingDirectory) {
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path("/");
  Config c;
  EXPECT_NO_THROW(c = load_config(path("exp/lr.toml")));
  std::filesystem::current_path(cwd);
  EXPECT_EQ(c.model.width, 48);
  // A single string is one include; an absolute path is taken as it is.
  write("exp/abs.toml", "include = \"" + path("base/model.toml") + "\"\n[train]\nsteps = 5\n");
  const Config d = load_config(path("exp/abs.toml"));
  EXPECT_EQ(d.model.layers, 3);
  EXPECT_EQ(d.train.steps, 5);
}

TEST_F(ConfigLayers, IncludeCycleIsRefusedNamingTheChain) {
  write("a.toml", "include = [\"sub/b.toml\"]\n[data]\ntrain = \"x.bin\"\n");
  std::filesystem::create_directories(path("sub"));
  write("sub/b.toml", "include = [\"../a.toml\"]\n");
  const std::string msg = error_of([&] { load_config(path("a.toml")); });
  EXPECT_EQ(msg, path("a.toml") + " -> " + path("sub/b.toml") + " -> " + path("a.toml") +
                     ": include cycle: the file includes itself");
  write("self.toml", "include = [\"./self.toml\"]\n");
  expect_one_line_with(error_of([&] { load_config(path("self.toml")); }),
                       {path("self.toml") + " -> " + path("self.toml") + ": include cycle"});
}

TEST_F(ConfigLayers, DiamondIsNoCycle) {
  write("left.toml", "include = [\"base/model.toml\"]\n");
  write("right.toml", "include = [\"base/model.toml\"]\n[model]\nlayers = 6\n");
  write("top.toml", "include = [\"left.toml\", \"right.toml\"]\n");
  EXPECT_EQ(load_config(path("top.toml")).model.layers, 6);
}

TEST_F(ConfigLayers, MissingIncludeIsRefusedNamingTheChain) {
  write("exp/broken.toml", "include = [\"../base/train.toml\", \"../base/nope.toml\"]\n");
  const std::string msg = error_of([&] { load_config(path("exp/broken.toml")); });
  EXPECT_EQ(msg, path("exp/broken.toml") + " -> " + path("base/nope.toml") +
                     ": cannot open file: No such file or directory");
  // Nested: the whole chain.
  write("base/deep.toml", "include = [\"gone/x.toml\"]\n");
  write("exp/deep.toml", "include = [\"../base/deep.toml\"]\n");
  EXPECT_EQ(error_of([&] { load_config(path("exp/deep.toml")); }),
            path("exp/deep.toml") + " -> " + path("base/deep.toml") + " -> " +
                path("base/gone/x.toml") + ": cannot open file: No such file or directory");
}

TEST_F(ConfigLayers, ErrorsInAnIncludedFileNameIt) {
  write("base/bad.toml", "[model]\nlayerz = 3\n");
  write("exp/uses_bad.toml", "include = [\"../base/bad.toml\"]\n");
  EXPECT_EQ(error_of([&] { load_config(path("exp/uses_bad.toml")); }),
            path("exp/uses_bad.toml") + " -> " + path("base/bad.toml") +
                ": unknown key 'model.layerz'");
  write("base/syntax.toml", "[model\n");
  write("exp/uses_syntax.toml", "include = \"../base/syntax.toml\"\n");
  expect_one_line_with(error_of([&] { load_config(path("exp/uses_syntax.toml")); }),
                       {path("exp/uses_syntax.toml") + " -> " + path("base/syntax.toml") + ":1:",
                        "TOML syntax error"});
  // A value that breaks a rule names the file that set it.
  write("base/zero.toml", "[model]\nlayers = 0\n");
  write("exp/uses_zero.toml", "include = [\"../base/zero.toml\"]\n[data]\ntrain = \"x.bin\"\n");
  EXPECT_EQ(error_of([&] { load_config(path("exp/uses_zero.toml")); }),
            path("base/zero.toml") + ": model.layers (0) must be >= 1");
}

TEST_F(ConfigLayers, IncludeMustBePathsAtTheTopOfAFile) {
  write("num.toml", "include = 3\n");
  EXPECT_EQ(error_of([&] { load_config(path("num.toml")); }),
            path("num.toml") + ": include: expected a file path or an array of them, got integer 3");
  write("empty.toml", "include = [\"\"]\n");
  EXPECT_EQ(error_of([&] { load_config(path("empty.toml")); }),
            path("empty.toml") + ": include: an entry is empty (expected a file path)");
  write("in_section.toml", "[model]\ninclude = [\"x.toml\"]\n");
  EXPECT_EQ(error_of([&] { load_config(path("in_section.toml")); }),
            path("in_section.toml") + ": unknown key 'model.include'");
  // Text (a checkpoint's config attribute) has no directory to resolve an include against.
  expect_one_line_with(error_of([&] { parse_config("include = [\"a.toml\"]\n", "text"); }),
                       {"text: include: only a config file given with --config"});
  EXPECT_EQ(error_of([&] { load_configs({}); }), "no config file given (--config FILE)");
}

}  // namespace
}  // namespace trident

namespace trident {
namespace {

// configs/exp/*.toml include the shipped bases and load from any working directory.
TEST(ConfigLayersRepository, ExperimentConfigsLoad) {
  const std::string exp = std::string(TRIDENT_SOURCE_DIR) + "/configs/exp/";
  const Config high = load_config(exp + "tiny_lr_high.toml");
  EXPECT_DOUBLE_EQ(high.optim.lr, 4e-3);
  EXPECT_EQ(high.model.layers, 8);  // from configs/tiny.toml
  EXPECT_EQ(high.provenance.at("model.layers"),
            (std::filesystem::path(exp) / "../tiny.toml").lexically_normal().string());
  // An overlay (no include) layered after an experiment changes only its own keys.
  const Config both = load_configs({exp + "tiny_lr_high.toml", exp + "tiny_short.toml"});
  EXPECT_EQ(both.train.steps, 100);
  EXPECT_DOUBLE_EQ(both.optim.lr, 4e-3);
  EXPECT_EQ(both.log.dir, "runs/tiny_lr_high");
  EXPECT_EQ(both.provenance.at("train.steps"), exp + "tiny_short.toml");
}

}  // namespace
}  // namespace trident
