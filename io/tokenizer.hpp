// Tokenizers as Hugging Face `tokenizers` writes them (tokenizer.json): text to token ids and
// back, with the ids `tokenizers` gives. Byte-level BPE (GPT-2, Llama 3: ByteLevel and Split
// pre-tokenizers, merges, ignore_merges, added and special tokens, TemplateProcessing), read from
// tokenizer.json or from GPT-2's vocab.json and merges.txt; SentencePiece's BPE as transformers
// converts it (Llama 2, Mistral: byte fallback, Metaspace or Prepend and Replace, its decoder),
// or SentencePiece's own tokenizer.model through libsentencepiece; and WordPiece (BERT:
// BertNormalizer, BertPreTokenizer, ## continuations). Pre-tokenizer patterns run on ICU's regular expressions
// (Unicode properties and look-ahead, as tokenizers' Oniguruma); what a file asks for that is not
// read is an error naming it, never other ids.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qkv::io {

class Tokenizer {
 public:
  /// The tokenizer of a model folder: tokenizer.json, else vocab.json + merges.txt (GPT-2's
  /// files), else tokenizer.model (SentencePiece's). Throws IoError naming the file and what is
  /// wrong.
  static Tokenizer from_folder(const std::string& dir);
  /// From tokenizer.json's text; `what` names it in errors.
  static Tokenizer from_json(const std::string& json, const std::string& what);
  /// From SentencePiece's own tokenizer.model (read by libsentencepiece): the ids sentencepiece
  /// gives each text between special tokens, <s> before them (unless the folder's
  /// tokenizer_config.json sets add_bos_token false; add_eos_token adds </s>), decoded as
  /// transformers decodes a converted model.
  static Tokenizer from_sentencepiece(const std::string& model_path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Token ids of UTF-8 text; with `add_special_tokens`, the post-processor's (Llama 3's
  /// <|begin_of_text|>) around them, as tokenizers' encode(text).ids.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  /// The text of ids (bytes that do not form UTF-8 become U+FFFD, as errors="replace");
  /// special tokens left out with `skip_special_tokens`.
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens = false) const;
  /// The bytes one token stands for (for streaming: a character may span tokens).
  std::string token_bytes(std::int32_t id) const;
  /// What the decoder makes of one token (the first of a text or not): its bytes for byte-level
  /// BPE; for WordPiece, the word with a space before it or the continuation glued on.
  std::string piece(std::int32_t id, bool first) const;
  /// Whether `id` is a special token (<|endoftext|>, [CLS]).
  bool is_special(std::int32_t id) const;
  /// The id of a token (a special token's content, or a vocabulary entry).
  std::optional<std::int32_t> token_id(std::string_view token) const;
  /// One more than the largest id.
  std::int64_t vocab_size() const;

  /// What a tokenizer holds (io/tokenizer.cpp).
  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Decodes ids one at a time into text as soon as it is whole: the bytes of tokens that end inside
/// a UTF-8 character wait for the tokens that complete it (what `qkv generate` streams).
class TextStream {
 public:
  explicit TextStream(const Tokenizer& t, bool skip_special_tokens = true) : t_(t), skip_special_(skip_special_tokens) {}
  /// The text that `id` completes (possibly empty).
  std::string push(std::int32_t id);
  /// What is left at the end (an incomplete character, as U+FFFD).
  std::string finish();

 private:
  const Tokenizer& t_;
  bool skip_special_;
  std::string pending_;
  bool started_ = false;
};

}  // namespace qkv::io
