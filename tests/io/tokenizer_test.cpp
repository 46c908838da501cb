// Tokenizers against Hugging Face tokenizers' ids (tests/fixtures/make_hf_fixtures.py): GPT-2's
// byte-level BPE, a Llama 3-style one (Split pattern, ignore_merges, <|begin_of_text|>), and
// SentencePiece-style byte-fallback BPE (Llama 2, Mistral) in two layouts, on
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

// SentencePiece's BPE as transformers converts it (Llama 2, Mistral, TinyLlama): "▁" for spaces
// and before the text, characters outside the vocabulary as byte tokens, <s> from the template;
// in the layout with a Prepend and Replace normalizer, and in the one with a Metaspace
// pre-tokenizer that prepends only where the text starts the input ("<s>Hello" has no "▁"),
// whole or split before each "▁" (split=true: no merge crosses a word).
TEST(Tokenizer, SentencePieceByteFallbackBpeGivesTokenizersIds) {
  for (const char* layout : {"llama2", "metaspace", "metaspace-split"}) {
    SCOPED_TRACE(layout);
    const std::string dir = kFixtures + "/tokenizers/sentencepiece-" + layout;
    const io::Tokenizer t = io::Tokenizer::from_folder(dir);
    expect_cases(t, dir + "/cases.json", 14);
    // A character no training text had falls back to its UTF-8 bytes' tokens: U+2135 is E2 84 B5.
    const std::vector<std::int32_t> ids = t.encode("x\u2135", false);
    ASSERT_GE(ids.size(), 3u);
    const std::vector<std::int32_t> bytes(ids.end() - 3, ids.end());
    EXPECT_EQ(bytes, (std::vector<std::int32_t>{*t.token_id("<0xE2>"), *t.token_id("<0x84>"), *t.token_id("<0xB5>")}));
    EXPECT_EQ(t.token_bytes(bytes[0]), "\xE2");
    EXPECT_THROW(t.piece(static_cast<std::int32_t>(t.vocab_size()), false), UsageError);  // an id past the vocabulary
    EXPECT_THROW(t.token_bytes(-1), UsageError);
    EXPECT_EQ(t.decode(ids), "x\u2135");
    EXPECT_EQ(t.decode(t.encode("Hello world"), true), "Hello world");  // <s> skipped, the leading space stripped
  }
}

// SentencePiece's own tokenizer.model, read by libsentencepiece: sentencepiece's ids (a run of
// spaces split as SentencePiece splits it, not as the BPE transformers converts it to); and that
// conversion, a tokenizer.json with a Metaspace that always prepends, with transformers' ids.
TEST(Tokenizer, SentencePieceModelFileGivesSentencePieceIds) {
  const std::string dir = kFixtures + "/tokenizers/sentencepiece-model";
  const io::Tokenizer t = io::Tokenizer::from_folder(dir);
  expect_cases(t, dir + "/cases.json", 14);
  EXPECT_EQ(t.token_id("<s>"), 1);
  EXPECT_TRUE(t.is_special(1));
  EXPECT_EQ(t.decode(t.encode("x\u2135 y"), true), "x\u2135 y");
  expect_cases(io::Tokenizer::from_folder(kFixtures + "/tokenizers/sentencepiece-converted"),
               kFixtures + "/tokenizers/sentencepiece-converted/cases.json", 14);
}

// A character with neither a token nor byte tokens is unk; fuse_unk makes a run of them one, and
// an unk waits for the next character in the vocabulary, so byte tokens before that come first
// (ids from tokenizers 0.23.3 on this vocabulary).
TEST(Tokenizer, UnknownCharactersFuseAndWaitAsTokenizersDoes) {
  for (const bool fuse : {true, false}) {
    const std::string json = R"({"model": {"type": "BPE", "vocab": {"<unk>": 0, "x": 1, "y": 2, "xy": 3, "<0x41>": 4},
                                 "merges": [["x", "y"]], "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": )" +
                             std::string(fuse ? "true" : "false") + "}}";
    const io::Tokenizer t = io::Tokenizer::from_json(json, "t.json");
    const std::vector<std::int32_t> expected = fuse ? std::vector<std::int32_t>{0, 3, 4, 0} : std::vector<std::int32_t>{0, 0, 3, 4, 0};
    EXPECT_EQ(t.encode("\u2135\u2135xy\u2135A"), expected);
  }
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
  for (const auto& [part, named] : std::vector<std::pair<std::string, std::string>>{
           {R"("normalizer": {"type": "NFKC"})", "normalizer \"NFKC\" is not read yet"},
           {R"("decoder": {"type": "CTC"})", "decoder \"CTC\" is not read yet"},
           {R"("decoder": {"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 0, "stop": 1}]})",
            "a Strip decoder with stop after Fuse is not read yet"},
           {R"("pre_tokenizer": {"type": "Metaspace", "replacement": "_", "prepend_scheme": "sometimes"})",
            "Metaspace prepend_scheme \"sometimes\" is not read"}}) {
    try {
      io::Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, )" + part + "}", "t.json");
      ADD_FAILURE() << part << " was read";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("t.json: " + named), std::string::npos) << e.what();
    }
  }
  // A tokenizer.model that is not one.
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "bad_tokenizer_model";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.model") << "not a model";
  try {
    io::Tokenizer::from_folder(dir.string());
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "tokenizer.model").string() + ": not a SentencePiece model"), std::string::npos) << e.what();
  }
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
