// Tokenizers as Hugging Face tokenizers computes them: added tokens split out first, then the
// normaliser and the pre-tokenizers' pieces; byte-level BPE maps each piece's bytes to printable
// characters (GPT-2's bytes_to_unicode) and merges them by rank, WordPiece takes the longest
// vocabulary entries first; then the post-processor's special tokens.
#include "io/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <queue>

#include "io/file.hpp"
#include "ir/error.hpp"

namespace qkv::io {

namespace {

using nlohmann::json;

/// GPT-2's pattern, which ByteLevel(use_regex=true) splits with.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// bytes_to_unicode: each byte as a printable code point (printable Latin-1 bytes as
/// themselves, the others from U+0100 on).
std::array<char32_t, 256> byte_to_codepoint() {
  std::array<char32_t, 256> map{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? static_cast<char32_t>(b) : next++;
  return map;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

/// The code points of valid UTF-8 (each a string of its bytes).
std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    out.emplace_back(s.substr(i, std::min(n, s.size() - i)));
    i += n;
  }
  return out;
}

/// Whether `s` is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
std::size_t valid_utf8_prefix(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    char32_t cp = 0, min = 0;
    if (c < 0x80) n = 1, cp = c;
    else if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (i + n > s.size()) return i;
    for (std::size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n;
  }
  return i;
}

/// Bytes as text: valid UTF-8 kept, each invalid byte (or truncated sequence) one U+FFFD.
std::string replace_invalid(std::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    const std::size_t ok = valid_utf8_prefix(bytes);
    out += bytes.substr(0, ok);
    bytes.remove_prefix(ok);
    if (bytes.empty()) break;
    out += "\xEF\xBF\xBD";
    // Skip the lead byte and its continuation bytes that cannot start anything.
    std::size_t skip = 1;
    while (skip < bytes.size() && skip < 4 && (static_cast<unsigned char>(bytes[skip]) & 0xC0) == 0x80 &&
           (static_cast<unsigned char>(bytes[0]) & 0xC0) != 0x80)
      ++skip;
    bytes.remove_prefix(skip);
  }
  return out;
}

/// A regular expression split as tokenizers' Split(pattern, behavior): the matches and the text
/// between them as pieces (Isolated), or only the text between (Removed).
struct Splitter {
  std::unique_ptr<icu::RegexPattern> pattern;
  bool keep_matches = true;

  std::vector<std::string> split(const std::string& text) const {
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexMatcher> m(pattern->matcher(u, status));
    std::vector<std::string> pieces;
    auto piece = [&](std::int32_t a, std::int32_t b) {
      if (a >= b) return;
      std::string s;
      u.tempSubStringBetween(a, b).toUTF8String(s);
      pieces.push_back(std::move(s));
    };
    if (U_FAILURE(status)) throw IoError(std::string("tokenizer: a pattern failed on the text (") + u_errorName(status) + ")");
    std::int32_t last = 0;
    while (m->find(status) && U_SUCCESS(status)) {
      const std::int32_t a = m->start(status), b = m->end(status);
      if (a == b) continue;  // an empty match splits nothing
      piece(last, a);
      if (keep_matches) piece(a, b);
      last = b;
    }
    if (U_FAILURE(status)) throw IoError(std::string("tokenizer: a pattern failed on the text (") + u_errorName(status) + ")");
    piece(last, u.length());
    return pieces;
  }
};

std::unique_ptr<icu::RegexPattern> compile(const std::string& regex, const std::string& what) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError where{};
  std::unique_ptr<icu::RegexPattern> p(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(regex), 0, where, status));
  if (U_FAILURE(status)) throw IoError(what + ": the pattern " + regex + " is not a regular expression ICU reads (" + u_errorName(status) + ")");
  return p;
}

/// Code points of UTF-8 text (ICU's reading: invalid bytes as U+FFFD).
std::vector<char32_t> code_points(const std::string& text) {
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
  std::vector<char32_t> out;
  for (std::int32_t i = 0; i < u.length(); i = u.moveIndex32(i, 1)) out.push_back(static_cast<char32_t>(u.char32At(i)));
  return out;
}

std::string to_utf8(const std::vector<char32_t>& cps) {
  std::string s;
  for (char32_t c : cps) append_utf8(s, c);
  return s;
}

/// Rust's char::is_whitespace (tokenizers' test): the White_Space property.
bool is_whitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

/// BertNormalizer (tokenizers' order): control characters dropped and whitespace made spaces,
/// CJK ideographs spaced apart, accents stripped (NFD less nonspacing marks), lowercased per
/// character (full case mapping, no context, as Rust's char::to_lowercase).
struct BertNormalizer {
  bool clean_text = true, chinese = true, strip_accents = true, lowercase = true;

  static bool is_cjk(char32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
  }

  std::string apply(const std::string& text) const {
    std::vector<char32_t> cps;
    for (char32_t c : code_points(text)) {
      if (clean_text) {
        const auto type = u_charType(static_cast<UChar32>(c));
        const bool control =
            c != U'\t' && c != U'\n' && c != U'\r' &&
            (type == U_CONTROL_CHAR || type == U_FORMAT_CHAR || type == U_SURROGATE || type == U_PRIVATE_USE_CHAR || type == U_UNASSIGNED);
        if (c == 0 || c == 0xFFFD || control) continue;
        if (is_whitespace(c)) c = ' ';
      }
      if (chinese && is_cjk(c)) {
        cps.insert(cps.end(), {U' ', c, U' '});
        continue;
      }
      cps.push_back(c);
    }
    if (strip_accents) {
      UErrorCode status = U_ZERO_ERROR;
      const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
      icu::UnicodeString u = icu::UnicodeString::fromUTF8(to_utf8(cps));
      const icu::UnicodeString decomposed = nfd->normalize(u, status);
      std::vector<char32_t> kept;
      for (std::int32_t i = 0; i < decomposed.length(); i = decomposed.moveIndex32(i, 1)) {
        const UChar32 c = decomposed.char32At(i);
        if (u_charType(c) != U_NON_SPACING_MARK) kept.push_back(static_cast<char32_t>(c));
      }
      cps = std::move(kept);
    }
    if (!lowercase) return to_utf8(cps);
    std::string out;
    for (char32_t c : cps) {
      icu::UnicodeString one(static_cast<UChar32>(c));
      one.toLower(icu::Locale::getRoot());
      if (one.length() == 1 || (one.length() == 2 && U16_IS_LEAD(one.charAt(0)))) {
        append_utf8(out, static_cast<char32_t>(one.char32At(0)));
      } else {
        std::string s;
        one.toUTF8String(s);
        out += s;
      }
    }
    return out;
  }
};

/// BertPreTokenizer: split on whitespace (dropped) and around each punctuation character (ASCII
/// punctuation or Unicode's P* categories).
std::vector<std::string> bert_pre_tokenize(const std::string& text) {
  std::vector<std::string> pieces;
  std::vector<char32_t> word;
  auto flush = [&] {
    if (!word.empty()) pieces.push_back(to_utf8(word));
    word.clear();
  };
  for (char32_t c : code_points(text)) {
    if (is_whitespace(c)) {
      flush();
    } else if ((c < 0x80 && std::ispunct(static_cast<int>(c))) || u_ispunct(static_cast<UChar32>(c))) {
      flush();
      pieces.push_back(to_utf8({c}));
    } else {
      word.push_back(c);
    }
  }
  flush();
  return pieces;
}

struct PairHash {
  std::size_t operator()(const std::pair<std::string, std::string>& p) const {
    return std::hash<std::string>()(p.first) * 31 + std::hash<std::string>()(p.second);
  }
};

}  // namespace

struct Tokenizer::Impl {
  std::string what;
  std::unordered_map<std::string, std::int32_t> vocab;
  std::vector<std::string> tokens;  // id -> token (vocabulary or added)
  std::unordered_map<std::pair<std::string, std::string>, int, PairHash> ranks;
  bool ignore_merges = false;
  std::optional<std::int32_t> unk;
  // WordPiece (BERT): longest match first, continuations prefixed.
  bool wordpiece = false;
  std::string continuing_prefix = "##";
  std::size_t max_word_chars = 100;
  // The normalizers, in order: BertNormalizer, or SentencePiece's Prepend("▁") and Replace(" ", "▁").
  struct Normalizer {
    std::optional<BertNormalizer> bert;
    std::string prepend;   // Prepend: before a non-empty text
    std::string from, to;  // Replace: every `from` (a literal) by `to`
  };
  std::vector<Normalizer> normalizers;
  bool bert_pre_tokenizer = false;
  // Metaspace: spaces as `replacement` and one before the text (always, or where the text starts
  // the input: "first"), then pieces that each start at a replacement when `split`.
  struct Metaspace {
    std::string replacement;
    bool prepend_always = false, prepend_first = false, split = true;
  };
  std::optional<Metaspace> metaspace;
  // SentencePiece's BPE: a character outside the vocabulary as its bytes' tokens <0x00>..<0xFF>,
  // and (fuse_unk) a run of characters with no tokens as one unk.
  bool byte_fallback = false, fuse_unk = false;
  // The decoder, where it is neither ByteLevel nor WordPiece: each token through Replace and
  // ByteFallback, Fuse (tokens joined: what follows applies to the text), Strip.
  struct DecodeStep {
    enum Kind { replace, byte_fallback, fuse, strip } kind;
    std::string from, to;             // replace; strip: `from` is the character stripped
    std::size_t start = 0, stop = 0;  // strip: at most this many from the start and from the end
  };
  std::vector<DecodeStep> decoder;
  // SentencePiece's own model (tokenizer.model): it encodes each text between added tokens.
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sentencepiece;

  /// The decoder transformers gives a converted SentencePiece model: "▁" as a space, byte tokens
  /// as their bytes, the text's first space dropped.
  void sentencepiece_decoder() {
    decoder = {{DecodeStep::replace, "\u2581", " ", 0, 0},
               {DecodeStep::byte_fallback, "", "", 0, 0},
               {DecodeStep::fuse, "", "", 0, 0},
               {DecodeStep::strip, " ", "", 1, 0}};
  }
  // Added tokens, longest first (matched before anything else), and which ids are special.
  std::vector<std::pair<std::string, std::int32_t>> added;
  std::vector<bool> special;
  std::vector<Splitter> splits;
  bool byte_level = false;
  bool add_prefix_space = false;
  std::size_t byte_level_at = 0;  // the splits before ByteLevel's own
  std::array<char32_t, 256> to_cp = byte_to_codepoint();
  std::unordered_map<char32_t, unsigned char> from_cp;
  // The post-processor: ids before and after the sequence.
  std::vector<std::int32_t> prefix, suffix;

  void set_token(std::int32_t id, const std::string& token) {
    // Ids index f32-held tensors on every backend: exact below 2^24.
    if (id < 0 || id >= (1 << 24)) throw IoError(what + ": token \"" + token + "\" has id " + std::to_string(id) + ", outside [0, 2^24)");
    if (static_cast<std::size_t>(id) >= tokens.size()) {
      tokens.resize(static_cast<std::size_t>(id) + 1);
      special.resize(static_cast<std::size_t>(id) + 1);
    }
    tokens[static_cast<std::size_t>(id)] = token;
  }

  /// Token `id`'s string; a UsageError outside the vocabulary.
  const std::string& token(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= tokens.size()) throw UsageError("token id " + std::to_string(id) + " is outside the vocabulary");
    return tokens[static_cast<std::size_t>(id)];
  }

  void finish() {
    for (int b = 0; b < 256; ++b) from_cp[to_cp[b]] = static_cast<unsigned char>(b);
    std::stable_sort(added.begin(), added.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }

  /// A word's WordPiece tokens (all of it [UNK] when some part matches nothing), appended to `ids`.
  void word_piece(const std::string& word, std::vector<std::int32_t>& ids) const {
    const std::vector<std::string> chars = utf8_chars(word);
    auto unknown = [&] {
      if (!unk) throw IoError(what + ": \"" + word + "\" has no WordPiece tokens and there is no unk_token");
      ids.push_back(*unk);
    };
    if (chars.size() > max_word_chars) return unknown();
    std::vector<std::int32_t> pieces;
    for (std::size_t start = 0; start < chars.size();) {
      std::size_t end = chars.size();
      std::optional<std::int32_t> found;
      for (; end > start; --end) {
        std::string sub = start > 0 ? continuing_prefix : "";
        for (std::size_t i = start; i < end; ++i) sub += chars[i];
        if (auto it = vocab.find(sub); it != vocab.end()) {
          found = it->second;
          break;
        }
      }
      if (!found) return unknown();
      pieces.push_back(*found);
      start = end;
    }
    ids.insert(ids.end(), pieces.begin(), pieces.end());
  }

  /// The symbols after every merge, lowest rank first and the leftmost of equal ranks first, as
  /// tokenizers' Word::merge_all: a heap of candidate pairs over a linked list of symbols, so a
  /// piece of n characters takes O(n log n) (a long run of spaces or digits is one piece). A
  /// candidate is stale once either symbol has changed (its version) or been absorbed.
  std::vector<std::string> merge_by_rank(std::vector<std::string> text) const {
    const int n = static_cast<int>(text.size());
    std::vector<int> prev(static_cast<std::size_t>(n)), next(static_cast<std::size_t>(n)), version(static_cast<std::size_t>(n), 0);
    std::vector<char> alive(static_cast<std::size_t>(n), 1);
    for (int i = 0; i < n; ++i) prev[static_cast<std::size_t>(i)] = i - 1, next[static_cast<std::size_t>(i)] = i + 1 < n ? i + 1 : -1;
    struct Candidate {
      int rank, left, right, left_version, right_version;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto at = [](auto& v, int i) -> auto& { return v[static_cast<std::size_t>(i)]; };
    auto consider = [&](int left) {
      const int right = left < 0 ? -1 : at(next, left);
      if (right < 0) return;
      if (auto it = ranks.find({at(text, left), at(text, right)}); it != ranks.end())
        heap.push({it->second, left, right, at(version, left), at(version, right)});
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (!at(alive, c.left) || !at(alive, c.right) || at(next, c.left) != c.right || at(version, c.left) != c.left_version ||
          at(version, c.right) != c.right_version)
        continue;
      at(text, c.left) += at(text, c.right);
      ++at(version, c.left);
      at(alive, c.right) = 0;
      at(next, c.left) = at(next, c.right);
      if (at(next, c.left) >= 0) at(prev, at(next, c.left)) = c.left;
      consider(at(prev, c.left));
      consider(c.left);
    }
    std::vector<std::string> merged;
    for (int i = 0; i < n; ++i)
      if (at(alive, i)) merged.push_back(std::move(at(text, i)));
    return merged;
  }

  /// A piece's characters as BPE's first symbols: with byte_fallback, one outside the vocabulary
  /// as its bytes' tokens (where the vocabulary has them all); else the unk token, a run of them
  /// one unk with fuse_unk. As tokenizers' BPE::merge_word, an unk waits for the next character
  /// in the vocabulary (or the end), so byte tokens that come between go before it.
  std::vector<std::string> initial_symbols(const std::string& piece) const {
    std::vector<std::string> chars = utf8_chars(piece);
    if (!byte_fallback && !fuse_unk) return chars;
    std::vector<std::string> symbols;
    bool pending_unk = false;
    auto end_unk = [&] {
      if (pending_unk) symbols.push_back(tokens[static_cast<std::size_t>(*unk)]);
      pending_unk = false;
    };
    for (std::string& c : chars) {
      if (vocab.contains(c)) {
        end_unk();
        symbols.push_back(std::move(c));
        continue;
      }
      if (byte_fallback) {
        std::vector<std::string> bytes;
        for (unsigned char b : c) {
          static const char* const hex = "0123456789ABCDEF";
          std::string token = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
          if (!vocab.contains(token)) break;
          bytes.push_back(std::move(token));
        }
        if (bytes.size() == c.size()) {
          symbols.insert(symbols.end(), bytes.begin(), bytes.end());
          continue;
        }
      }
      if (!unk) throw IoError(what + ": \"" + c + "\" is not in the vocabulary and there is no unk_token");
      if (!fuse_unk) end_unk();
      pending_unk = true;
    }
    end_unk();
    return symbols;
  }

  /// A piece's BPE tokens, appended to `ids`.
  void bpe(const std::string& piece, std::vector<std::int32_t>& ids) const {
    std::string mapped;
    if (byte_level) {
      for (unsigned char c : piece) append_utf8(mapped, to_cp[c]);
    } else {
      mapped = piece;
    }
    if (ignore_merges) {
      if (auto it = vocab.find(mapped); it != vocab.end()) return ids.push_back(it->second);
    }
    const std::vector<std::string> symbols = merge_by_rank(initial_symbols(mapped));
    for (const std::string& s : symbols) {
      auto it = vocab.find(s);
      if (it != vocab.end()) ids.push_back(it->second);
      else if (unk) ids.push_back(*unk);
      else throw IoError(what + ": the token \"" + s + "\" is not in the vocabulary and there is no unk_token");
    }
  }

  /// Every `from` in `text` replaced by `to`.
  static std::string replace_all(std::string text, const std::string& from, const std::string& to) {
    if (from.empty()) return text;
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) text.replace(at, from.size(), to);
    return text;
  }

  std::vector<std::string> metaspace_pieces(const std::string& text, bool at_start) const {
    const Metaspace& m = *metaspace;
    std::string s = replace_all(text, " ", m.replacement);
    if ((m.prepend_always || (m.prepend_first && at_start)) && !s.starts_with(m.replacement)) s.insert(0, m.replacement);
    if (!m.split) return {s};
    // Split before each replacement (tokenizers' MergedWithNext).
    std::vector<std::string> pieces;
    std::size_t from = 0;
    for (std::size_t at = s.find(m.replacement, 1); at != std::string::npos; at = s.find(m.replacement, at + 1)) {
      pieces.push_back(s.substr(from, at - from));
      from = at;
    }
    if (from < s.size()) pieces.push_back(s.substr(from));
    return pieces;
  }

  /// The ids of `raw`, a text between added tokens; `at_start` where it starts the input.
  void encode_text(const std::string& raw, std::vector<std::int32_t>& ids, bool at_start) const {
    if (sentencepiece) {
      std::vector<int> out;
      if (const auto status = sentencepiece->Encode(raw, &out); !status.ok()) throw IoError(what + ": " + status.ToString());
      ids.insert(ids.end(), out.begin(), out.end());
      return;
    }
    std::string text = raw;
    for (const Normalizer& n : normalizers) {
      if (n.bert) text = n.bert->apply(text);
      else if (!n.prepend.empty()) text = text.empty() ? text : n.prepend + text;
      else text = replace_all(std::move(text), n.from, n.to);
    }
    std::vector<std::string> pieces{text};
    if (metaspace) pieces = metaspace_pieces(text, at_start);
    if (bert_pre_tokenizer) pieces = bert_pre_tokenize(text);
    for (std::size_t k = 0; k <= splits.size(); ++k) {
      // ByteLevel's add_prefix_space: a space before every piece it is given, as tokenizers does.
      if (byte_level && add_prefix_space && k == byte_level_at)
        for (std::string& p : pieces)
          if (!p.starts_with(' ')) p.insert(0, 1, ' ');
      if (k == splits.size()) break;
      const Splitter& s = splits[k];
      std::vector<std::string> next;
      for (const std::string& p : pieces)
        for (std::string& q : s.split(p)) next.push_back(std::move(q));
      pieces = std::move(next);
    }
    for (const std::string& p : pieces) wordpiece ? word_piece(p, ids) : bpe(p, ids);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

void add_pre_tokenizer(Tokenizer::Impl& t, const json& p, const std::string& what);
void add_normalizer(Tokenizer::Impl& t, const json& n, const std::string& what);
void add_decoder(Tokenizer::Impl& t, const json& d, const std::string& what);

}  // namespace

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw IoError(what + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  auto t = std::make_unique<Impl>();
  t->what = what;
  try {
    const json& model = j.at("model");
    if (type_of(model) != "BPE" && type_of(model) != "WordPiece")
      throw IoError(what + ": model type \"" + type_of(model) + "\" is not read (BPE and WordPiece are)");
    t->wordpiece = type_of(model) == "WordPiece";
    for (const auto& [token, id] : model.at("vocab").items()) {
      t->vocab.emplace(token, id.get<std::int32_t>());
      t->set_token(id.get<std::int32_t>(), token);
    }
    if (t->wordpiece) {
      if (model.contains("continuing_subword_prefix") && model["continuing_subword_prefix"].is_string())
        t->continuing_prefix = model["continuing_subword_prefix"].get<std::string>();
      t->max_word_chars = model.value("max_input_chars_per_word", std::size_t{100});
    }
    int rank = 0;
    for (const json& m : t->wordpiece ? json::array() : model.at("merges")) {
      std::pair<std::string, std::string> pair;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const std::size_t space = s.find(' ');
        if (space == std::string::npos) throw IoError(what + ": merge \"" + s + "\" is not two tokens");
        pair = {s.substr(0, space), s.substr(space + 1)};
      } else {
        pair = {m.at(0).get<std::string>(), m.at(1).get<std::string>()};
      }
      t->ranks.emplace(std::move(pair), rank++);
    }
    t->ignore_merges = model.value("ignore_merges", false);
    if (model.contains("unk_token") && model["unk_token"].is_string())
      if (auto it = t->vocab.find(model["unk_token"].get<std::string>()); it != t->vocab.end()) t->unk = it->second;
    t->byte_fallback = model.value("byte_fallback", false);
    t->fuse_unk = model.value("fuse_unk", false);
    for (const char* key : {"end_of_word_suffix"})
      if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
        throw IoError(what + ": BPE with " + key + " is not read yet");
    if (!t->wordpiece && model.contains("continuing_subword_prefix") && model["continuing_subword_prefix"].is_string() &&
        !model["continuing_subword_prefix"].get<std::string>().empty())
      throw IoError(what + ": BPE with continuing_subword_prefix is not read yet");
    for (const json& a : j.value("added_tokens", json::array())) {
      const auto id = a.at("id").get<std::int32_t>();
      const std::string content = a.at("content").get<std::string>();
      if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
        throw IoError(what + ": added token \"" + content + "\" with lstrip, rstrip or single_word is not read yet");
      t->set_token(id, content);
      t->special[static_cast<std::size_t>(id)] = a.value("special", false);
      t->added.emplace_back(content, id);
    }
    if (j.contains("normalizer") && !j["normalizer"].is_null()) add_normalizer(*t, j["normalizer"], what);
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) add_pre_tokenizer(*t, j["pre_tokenizer"], what);
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      std::vector<json> processors{j["post_processor"]};
      if (type_of(processors[0]) == "Sequence") processors = j["post_processor"].at("processors").get<std::vector<json>>();
      for (const json& p : processors) {
        const std::string type = type_of(p);
        if (type == "ByteLevel") continue;  // offsets only
        if (type != "TemplateProcessing") throw IoError(what + ": post_processor \"" + type + "\" is not read yet");
        bool before = true;
        for (const json& item : p.at("single")) {
          if (item.contains("Sequence")) {
            before = false;
            continue;
          }
          const std::string name = item.at("SpecialToken").at("id").get<std::string>();
          for (const json& id : p.at("special_tokens").at(name).at("ids")) (before ? t->prefix : t->suffix).push_back(id.get<std::int32_t>());
        }
      }
    }
    if (j.contains("decoder") && !j["decoder"].is_null() && type_of(j["decoder"]) != "ByteLevel" && type_of(j["decoder"]) != "WordPiece")
      add_decoder(*t, j["decoder"], what);
  } catch (const json::exception& e) {
    throw IoError(what + ": " + std::string(e.what()));
  }
  t->finish();
  return Tokenizer(std::move(t));
}

namespace {

void add_pre_tokenizer(Tokenizer::Impl& t, const json& p, const std::string& what) {
  const std::string type = type_of(p);
  if (t.byte_level) throw IoError(what + ": a pre-tokenizer after ByteLevel is not read");
  if (t.metaspace) throw IoError(what + ": a pre-tokenizer after Metaspace is not read");
  if (type == "Sequence") {
    for (const json& q : p.at("pretokenizers")) add_pre_tokenizer(t, q, what);
  } else if (type == "BertPreTokenizer") {
    t.bert_pre_tokenizer = true;
  } else if (type == "ByteLevel") {
    t.byte_level = true;
    t.add_prefix_space = p.value("add_prefix_space", false);
    t.byte_level_at = t.splits.size();
    if (p.value("use_regex", true)) t.splits.push_back({compile(kGpt2Pattern, what), true});
  } else if (type == "Split") {
    const json& pattern = p.at("pattern");
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = pattern["Regex"].get<std::string>();
    } else {
      // A literal string: escaped as a pattern.
      for (char c : pattern.at("String").get<std::string>()) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) regex += '\\';
        regex += c;
      }
    }
    const std::string behavior = p.value("behavior", "Isolated");
    if (p.value("invert", false) || (behavior != "Isolated" && behavior != "Removed"))
      throw IoError(what + ": Split with behavior " + behavior + (p.value("invert", false) ? ", inverted," : "") +
                    " is not read (Isolated and Removed are)");
    t.splits.push_back({compile(regex, what), behavior == "Isolated"});
  } else if (type == "Metaspace") {
    if (!t.splits.empty() || t.bert_pre_tokenizer) throw IoError(what + ": Metaspace with other pre-tokenizers is not read");
    Tokenizer::Impl::Metaspace m;
    m.replacement = p.value("replacement", "\u2581");
    // prepend_scheme (tokenizers >= 0.14), or the older add_prefix_space.
    const std::string scheme = p.contains("prepend_scheme")        ? p["prepend_scheme"].get<std::string>()
                               : p.value("add_prefix_space", true) ? "always"
                                                                   : "never";
    if (scheme != "always" && scheme != "first" && scheme != "never")
      throw IoError(what + ": Metaspace prepend_scheme \"" + scheme + "\" is not read");
    m.prepend_always = scheme == "always";
    m.prepend_first = scheme == "first";
    m.split = p.value("split", true);
    t.metaspace = m;
  } else {
    throw IoError(what + ": pre_tokenizer \"" + type + "\" is not read yet (ByteLevel, Split, BertPreTokenizer, Metaspace and Sequence are)");
  }
}

void add_normalizer(Tokenizer::Impl& t, const json& n, const std::string& what) {
  const std::string type = type_of(n);
  Tokenizer::Impl::Normalizer step;
  if (type == "Sequence") {
    for (const json& m : n.at("normalizers")) add_normalizer(t, m, what);
    return;
  }
  if (type == "BertNormalizer") {
    BertNormalizer b;
    b.clean_text = n.value("clean_text", true);
    b.chinese = n.value("handle_chinese_chars", true);
    b.lowercase = n.value("lowercase", true);
    b.strip_accents = n.contains("strip_accents") && n["strip_accents"].is_boolean() ? n["strip_accents"].get<bool>() : b.lowercase;
    step.bert = b;
  } else if (type == "Prepend") {
    step.prepend = n.at("prepend").get<std::string>();
    if (step.prepend.empty()) return;
  } else if (type == "Replace" && n.at("pattern").contains("String")) {
    step.from = n["pattern"]["String"].get<std::string>();
    step.to = n.at("content").get<std::string>();
  } else {
    throw IoError(what + ": normalizer \"" + type + (type == "Replace" ? "\" with a Regex pattern" : "\"") +
                  " is not read yet (BertNormalizer, Prepend, Replace of a string and Sequence are)");
  }
  t.normalizers.push_back(std::move(step));
}

void add_decoder(Tokenizer::Impl& t, const json& d, const std::string& what) {
  using Step = Tokenizer::Impl::DecodeStep;
  const std::string type = type_of(d);
  if (type == "Sequence") {
    for (const json& e : d.at("decoders")) add_decoder(t, e, what);
    return;
  }
  Step step{Step::fuse, "", "", 0, 0};
  if (type == "Replace" && d.at("pattern").contains("String")) {
    step = {Step::replace, d["pattern"]["String"].get<std::string>(), d.at("content").get<std::string>(), 0, 0};
  } else if (type == "ByteFallback") {
    step.kind = Step::byte_fallback;
  } else if (type == "Fuse") {
    step.kind = Step::fuse;
  } else if (type == "Strip") {
    step = {Step::strip, d.at("content").get<std::string>(), "", d.value("start", std::size_t{0}), d.value("stop", std::size_t{0})};
    const bool fused = std::any_of(t.decoder.begin(), t.decoder.end(), [](const Step& s) { return s.kind == Step::fuse; });
    // After Fuse it strips the whole text's end, which a stream of tokens does not know yet.
    if (fused && step.stop > 0) throw IoError(what + ": a Strip decoder with stop after Fuse is not read yet");
  } else {
    throw IoError(what + ": decoder \"" + type +
                  "\" is not read yet (ByteLevel, WordPiece, and Sequences of Replace of a string, ByteFallback, Fuse and Strip are)");
  }
  t.decoder.push_back(std::move(step));
}

}  // namespace

Tokenizer Tokenizer::from_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path json_path = fs::path(dir) / "tokenizer.json";
  if (fs::exists(json_path)) return from_json(read_file(json_path.string()), json_path.string());
  const fs::path vocab = fs::path(dir) / "vocab.json", merges = fs::path(dir) / "merges.txt";
  if (!fs::exists(vocab) || !fs::exists(merges)) {
    if (fs::exists(fs::path(dir) / "tokenizer.model")) return from_sentencepiece((fs::path(dir) / "tokenizer.model").string());
    throw IoError(dir + ": no tokenizer.json, tokenizer.model, nor vocab.json and merges.txt");
  }
  // GPT-2's files as a tokenizer.json: byte-level BPE, <|endoftext|> special where the vocabulary has it.
  json j;
  json vocab_json;
  try {
    vocab_json = json::parse(read_file(vocab.string()));
  } catch (const json::exception& e) {
    throw IoError(vocab.string() + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  json merge_list = json::array();
  const std::string text = read_file(merges.string());
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && !line.starts_with("#version")) merge_list.push_back(line);
    at = end + 1;
  }
  j["model"] = {{"type", "BPE"}, {"vocab", vocab_json}, {"merges", merge_list}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  if (vocab_json.is_object() && vocab_json.contains("<|endoftext|>"))
    j["added_tokens"] = json::array({{{"id", vocab_json["<|endoftext|>"]}, {"content", "<|endoftext|>"}, {"special", true}}});
  return from_json(j.dump(), vocab.string());
}

Tokenizer Tokenizer::from_sentencepiece(const std::string& path) {
  auto t = std::make_unique<Impl>();
  t->what = path;
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  if (!std::filesystem::is_regular_file(path)) throw IoError(path + ": cannot open (not a file)");
  if (const auto status = sp->Load(path); !status.ok()) throw IoError(path + ": not a SentencePiece model (" + status.ToString() + ")");
  for (int id = 0; id < sp->GetPieceSize(); ++id) {
    const std::string piece = sp->IdToPiece(id);
    t->set_token(id, piece);
    t->vocab.emplace(piece, id);
    // <s>, </s> and <unk> are special, and found in a text before it is encoded, as transformers does.
    if (sp->IsControl(id) || sp->IsUnknown(id)) {
      t->special[static_cast<std::size_t>(id)] = true;
      t->added.emplace_back(piece, id);
    }
  }
  if (sp->unk_id() >= 0) t->unk = sp->unk_id();
  // <s> before the text and no </s> after it, unless the folder's tokenizer_config.json says otherwise.
  bool add_bos = true, add_eos = false;
  const std::filesystem::path config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    try {
      const json c = json::parse(read_file(config.string()));
      if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) add_bos = c["add_bos_token"].get<bool>();
      if (c.contains("add_eos_token") && c["add_eos_token"].is_boolean()) add_eos = c["add_eos_token"].get<bool>();
    } catch (const json::exception& e) {
      throw IoError(config.string() + ": not valid JSON (" + std::string(e.what()) + ")");
    }
  }
  if (add_bos && sp->bos_id() >= 0) t->prefix = {sp->bos_id()};
  if (add_eos && sp->eos_id() >= 0) t->suffix = {sp->eos_id()};
  t->sentencepiece_decoder();
  t->sentencepiece = std::move(sp);
  t->finish();
  return Tokenizer(std::move(t));
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<std::int32_t> ids;
  if (add_special_tokens) ids = impl_->prefix;
  // Added tokens first, leftmost and then longest; the text between them through the model.
  std::size_t done = 0;
  for (std::size_t i = 0; i <= text.size();) {
    const std::pair<std::string, std::int32_t>* hit = nullptr;
    if (i < text.size())
      for (const auto& a : impl_->added)
        if (!a.first.empty() && text.substr(i).starts_with(a.first)) {
          hit = &a;
          break;
        }
    if (!hit && i < text.size()) {
      ++i;
      continue;
    }
    if (i > done) impl_->encode_text(std::string(text.substr(done, i - done)), ids, done == 0);
    if (!hit) break;
    ids.push_back(hit->second);
    i += hit->first.size();
    done = i;
  }
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

std::string Tokenizer::token_bytes(std::int32_t id) const {
  if (!impl_->decoder.empty()) return piece(id, false);
  const std::string& token = impl_->token(id);
  const bool added = std::any_of(impl_->added.begin(), impl_->added.end(), [&](const auto& a) { return a.second == id; });
  if (!impl_->byte_level || added) return token;
  std::string bytes;
  for (const std::string& c : utf8_chars(token)) {
    // The code point back to its byte.
    char32_t cp = 0;
    const auto lead = static_cast<unsigned char>(c[0]);
    cp = c.size() == 1 ? lead : c.size() == 2 ? lead & 0x1F : c.size() == 3 ? lead & 0x0F : lead & 0x07;
    for (std::size_t k = 1; k < c.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(c[k]) & 0x3F);
    auto it = impl_->from_cp.find(cp);
    if (it == impl_->from_cp.end()) bytes += c;  // not a byte-level character: as it is
    else bytes += static_cast<char>(it->second);
  }
  return bytes;
}

bool Tokenizer::is_special(std::int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->special.size() && impl_->special[static_cast<std::size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (std::int32_t id : ids)
    if (!(skip_special_tokens && is_special(id))) {
      bytes += piece(id, first);
      first = false;
    }
  return replace_invalid(bytes);
}

std::string Tokenizer::piece(std::int32_t id, bool first) const {
  if (!impl_->decoder.empty()) {
    // tokenizers' decode_chain, one token at a time: after Fuse a step sees the whole text, of
    // which this token is the start when it is the first.
    using Step = Impl::DecodeStep;
    std::string s = impl_->token(id);
    bool fused = false;
    for (const Step& step : impl_->decoder) {
      switch (step.kind) {
        case Step::replace: s = Impl::replace_all(std::move(s), step.from, step.to); break;
        case Step::byte_fallback:
          if (s.size() == 6 && s.starts_with("<0x") && s[5] == '>' && std::isxdigit(static_cast<unsigned char>(s[3])) &&
              std::isxdigit(static_cast<unsigned char>(s[4])))
            s = std::string(1, static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
          break;
        case Step::fuse: fused = true; break;
        case Step::strip: {
          std::size_t front = 0, back = 0;
          if (!fused || first)
            while (front < step.start && s.compare(front * step.from.size(), step.from.size(), step.from) == 0) ++front;
          s.erase(0, front * step.from.size());
          if (!fused)
            while (back < step.stop && s.size() >= (back + 1) * step.from.size() &&
                   s.compare(s.size() - (back + 1) * step.from.size(), step.from.size(), step.from) == 0)
              ++back;
          s.erase(s.size() - back * step.from.size());
          break;
        }
      }
    }
    return s;
  }
  if (!impl_->wordpiece) return token_bytes(id);
  // tokenizers' WordPiece decoder, token by token: a continuation glued on, a word after a
  // space, then the cleanup of what English puts no space before (" ." -> ".").
  const std::string token = token_bytes(id);
  std::string s = token.starts_with(impl_->continuing_prefix) ? token.substr(impl_->continuing_prefix.size()) : (first ? "" : " ") + token;
  for (const char* from : {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're"}) {
    const std::string f = from, to = f == " ' " ? "'" : f.substr(1);
    for (std::size_t at = s.find(f); at != std::string::npos; at = s.find(f, at + to.size())) s.replace(at, f.size(), to);
  }
  return s;
}

std::optional<std::int32_t> Tokenizer::token_id(std::string_view token) const {
  for (const auto& a : impl_->added)
    if (a.first == token) return a.second;
  if (auto it = impl_->vocab.find(std::string(token)); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::int64_t Tokenizer::vocab_size() const { return static_cast<std::int64_t>(impl_->tokens.size()); }

std::string TextStream::push(std::int32_t id) {
  if (skip_special_ && t_.is_special(id)) return "";
  pending_ += t_.piece(id, !started_);
  started_ = true;
  // Emit the longest valid prefix; keep an incomplete character's bytes (at most 3) for later.
  const std::size_t ok = valid_utf8_prefix(pending_);
  std::string out;
  if (pending_.size() - ok >= 4 || (ok < pending_.size() && valid_utf8_prefix(pending_.substr(ok)) == 0 && pending_.size() - ok > 0 &&
                                    (static_cast<unsigned char>(pending_[ok]) & 0xC0) == 0x80)) {
    out = replace_invalid(pending_);
    pending_.clear();
    return out;
  }
  out = pending_.substr(0, ok);
  pending_.erase(0, ok);
  return out;
}

std::string TextStream::finish() {
  std::string out = replace_invalid(pending_);
  pending_.clear();
  return out;
}

}  // namespace qkv::io
