// Tokenizers against Hugging Face tokenizers' ids (tests/fixtures/make_hf_fixtures.py): GPT-2's
// byte-level BPE and a Llama 3-style one (Split pattern, ignore_merges, <|begin_of_text|>), on
// texts with Unicode, whitespace runs, digits, punctuation and characters no training text had.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "io/file.hpp"
#include "io/tokenizer.hpp"
#include "ir/error.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

const std::string kFixtures = std::string(QKV_SOURCE_DIR) + "/tests/fixtures/hf";

void expect_cases(const io::Tokenizer& t, const std::string& cases_path, std::size_t at_least = 8) {
  const nlohmann::json j = nlohmann::json::parse(io::read_file(cases_path));
  ASSERT_GE(j["cases"].size(), at_least);
  for (const auto& c : j["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(text.substr(0, 80));
    const std::vector<std::int32_t> ids = t.encode(text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<std::int32_t>>());
    EXPECT_EQ(t.decode(ids), c.value("decoded", text));
    // Streaming gives the same text, whatever token boundaries cut characters.
    io::TextStream stream(t, false);
    std::string streamed;
    for (std::int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    EXPECT_EQ(streamed, t.decode(ids));
  }
}

TEST(Tokenizer, Gpt2ByteLevelBpeGivesTokenizersIds) {
  const io::Tokenizer t = io::Tokenizer::from_folder(kFixtures + "/gpt2-tiny");
  expect_cases(t, kFixtures + "/tokenizers/gpt2-tiny-cases.json");
  EXPECT_EQ(t.vocab_size(), 400);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 0);
  EXPECT_TRUE(t.is_special(0));
  EXPECT_EQ(t.decode(t.encode("<|endoftext|>x"), true), "x");
}

TEST(Tokenizer, PiecesThousandsOfCharactersLongMergeAsTokenizersDoes) {
  // One piece each: runs of spaces, digits, letters, merged one pair at a time (lowest rank, then
  // leftmost) through a heap of candidates whose stale entries must be told from live ones.
  expect_cases(io::Tokenizer::from_folder(kFixtures + "/gpt2-tiny"), kFixtures + "/tokenizers/gpt2-tiny-long-cases.json", 5);
}

TEST(Tokenizer, Llama3StyleSplitIgnoreMergesAndTemplate) {
  const io::Tokenizer t = io::Tokenizer::from_folder(kFixtures + "/tokenizers/llama3-style");
  expect_cases(t, kFixtures + "/tokenizers/llama3-style/cases.json");
  const auto bos = t.token_id("<|begin_of_text|>");
  ASSERT_TRUE(bos);
  EXPECT_EQ(t.encode("hi").front(), *bos);
  EXPECT_NE(t.encode("hi", false).front(), *bos);
}

TEST(Tokenizer, BertWordPieceGivesTokenizersIds) {
  // A WordPiece tokenizer trained for the BERT fixture, and all-MiniLM-L6-v2's when fetched.
  expect_cases(io::Tokenizer::from_folder(kFixtures + "/bert-tiny"), kFixtures + "/bert-tiny/tokenizer_cases.json");
  QKV_MINILM_OR_SKIP(minilm);
  const io::Tokenizer t = io::Tokenizer::from_folder(minilm);
  expect_cases(t, kFixtures + "/minilm/tokenizer_cases.json");
  EXPECT_EQ(t.vocab_size(), 30522);
}

TEST(Tokenizer, Gpt2VocabAndMergesFilesReadAsTokenizerJson) {
  // GPT-2's older files: vocab.json and merges.txt, written from the fixture's tokenizer.json.
  const nlohmann::json j = nlohmann::json::parse(io::read_file(kFixtures + "/gpt2-tiny/tokenizer.json"));
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "gpt2_vocab_merges";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "vocab.json") << j["model"]["vocab"].dump();
  std::ofstream merges(dir / "merges.txt");
  merges << "#version: 0.2\n";
  for (const auto& m : j["model"]["merges"]) merges << m[0].get<std::string>() << " " << m[1].get<std::string>() << "\n";
  merges.close();
  expect_cases(io::Tokenizer::from_folder(dir.string()), kFixtures + "/tokenizers/gpt2-tiny-cases.json");
}

TEST(Tokenizer, UnreadableFilesNameTheProblem) {
  EXPECT_THROW(io::Tokenizer::from_folder("/nonexistent"), IoError);
  try {
    io::Tokenizer::from_json(R"({"model": {"type": "WordLevel", "vocab": {}}})", "t.json");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: model type \"WordLevel\" is not read"), std::string::npos) << e.what();
  }
  try {
    io::Tokenizer::from_json(
        R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}}})", "t.json");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: the pattern (["), std::string::npos) << e.what();
  }
  EXPECT_THROW(io::Tokenizer::from_json("{", "t.json"), IoError);
}

TEST(Tokenizer, StreamHoldsBytesOfAnIncompleteCharacter) {
  const io::Tokenizer t = io::Tokenizer::from_folder(kFixtures + "/gpt2-tiny");
  // An emoji no training text had: four byte tokens, the text only after the fourth.
  const std::vector<std::int32_t> ids = t.encode("🙂");
  ASSERT_EQ(ids.size(), 4u);
  io::TextStream stream(t);
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[2]), "");
  EXPECT_EQ(stream.push(ids[3]), "🙂");
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace qkv
