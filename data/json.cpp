// The JSON reader of json.h: recursive descent over the text in memory. Children are gathered
// on shared stacks and moved into an exactly-sized vector when their container closes, so a
// large file costs no vector regrowth; skipped members are checked but never built.
#include "data/json.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "data/utf8.h"
#include "runtime/check.h"

namespace yolo::data {

const char* json_kind_name(JsonKind kind) {
  switch (kind) {
    case JsonKind::Null: return "null";
    case JsonKind::Bool: return "a boolean";
    case JsonKind::Number: return "a number";
    case JsonKind::String: return "a string";
    case JsonKind::Array: return "an array";
    case JsonKind::Object: return "an object";
  }
  return "?";
}

const JsonValue* JsonValue::find(std::string_view key) const {
  for (const JsonMember& m : members)
    if (m.key == key) return &m.value;
  return nullptr;
}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& file, const JsonOptions& options)
      : text_(text), file_(file), options_(options) {}

  JsonValue parse_document() {
    if (text_.starts_with("\xEF\xBB\xBF")) pos_ = 3;  // UTF-8 byte order mark
    skip_spaces();
    if (at_end()) fail("empty file: expected a JSON value");
    JsonValue root;
    parse_value(&root, 0);
    skip_spaces();
    if (!at_end())
      fail("unexpected " + describe_here() + " after the JSON value that starts at line " + std::to_string(root.line));
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { fail_at(file_.c_str(), line_, message); }

  bool at_end() const { return pos_ >= text_.size(); }

  std::string describe_here() const {
    if (at_end()) return "the end of the file";
    std::string excerpt;
    for (size_t i = pos_; i < text_.size() && i < pos_ + 12 && text_[i] != '\n'; ++i)
      excerpt += static_cast<unsigned char>(text_[i]) < 0x20 ? '?' : text_[i];
    return "'" + excerpt + "'";
  }

  // Newlines only occur between tokens (strings may not hold raw control characters), so this
  // is the only place that counts lines.
  void skip_spaces() {
    for (; pos_ < text_.size(); ++pos_) {
      char c = text_[pos_];
      if (c == '\n') {
        ++line_;
      } else if (c != ' ' && c != '\t' && c != '\r') {
        break;
      }
    }
  }

  // `out` is null for a value being skipped: it is checked, not built.
  void parse_value(JsonValue* out, int depth) {
    if (at_end()) fail("the file ends where a value was expected (truncated?)");
    if (out) out->line = line_;
    char c = text_[pos_];
    if (c == '{') {
      parse_object(out, depth + 1);
    } else if (c == '[') {
      parse_array(out, depth + 1);
    } else if (c == '"') {
      if (out) out->kind = JsonKind::String;
      scratch_.clear();
      parse_string(out ? out->string : scratch_);
    } else if (c == '-' || is_digit(c)) {
      parse_number(out);
    } else if (literal("true")) {
      set_bool(out, true);
    } else if (literal("false")) {
      set_bool(out, false);
    } else if (!literal("null")) {
      fail("expected a value, found " + describe_here());
    }
  }

  static void set_bool(JsonValue* out, bool value) {
    if (!out) return;
    out->kind = JsonKind::Bool;
    out->boolean = value;
  }

  bool literal(std::string_view word) {
    if (!text_.substr(pos_).starts_with(word)) return false;
    pos_ += word.size();
    return true;
  }

  void check_depth(int depth) const {
    if (depth > kJsonMaxDepth) fail("arrays and objects nested deeper than " + std::to_string(kJsonMaxDepth) + " levels");
  }

  [[noreturn]] void fail_truncated(const char* what, int open_line) const {
    fail(std::string("the file ends inside the ") + what + " opened at line " + std::to_string(open_line) +
         " (truncated?)");
  }

  bool skipped(const std::string& key) const {
    return std::find(options_.skip_keys.begin(), options_.skip_keys.end(), key) != options_.skip_keys.end();
  }

  void parse_object(JsonValue* out, int depth) {
    check_depth(depth);
    int open_line = line_;
    ++pos_;
    size_t base = members_.size();
    skip_spaces();
    if (!at_end() && text_[pos_] == '}') {
      ++pos_;
    } else {
      while (true) {
        skip_spaces();
        if (at_end()) fail_truncated("object", open_line);
        if (text_[pos_] != '"') fail("expected a member name in double quotes, found " + describe_here());
        std::string key;
        parse_string(key);
        skip_spaces();
        if (at_end()) fail_truncated("object", open_line);
        if (text_[pos_] != ':') fail("expected ':' after the member name \"" + key + "\", found " + describe_here());
        ++pos_;
        skip_spaces();
        bool keep = out && !skipped(key);
        JsonValue value;
        parse_value(keep ? &value : nullptr, depth);
        if (keep) members_.push_back({std::move(key), std::move(value)});
        skip_spaces();
        if (at_end()) fail_truncated("object", open_line);
        if (text_[pos_] == '}') {
          ++pos_;
          break;
        }
        if (text_[pos_] != ',')
          fail("expected ',' or '}' in the object opened at line " + std::to_string(open_line) + ", found " +
               describe_here());
        ++pos_;
      }
    }
    if (!out) return;
    out->kind = JsonKind::Object;
    auto first = members_.begin() + static_cast<std::ptrdiff_t>(base);
    out->members.assign(std::make_move_iterator(first), std::make_move_iterator(members_.end()));
    members_.erase(first, members_.end());
  }

  void parse_array(JsonValue* out, int depth) {
    check_depth(depth);
    int open_line = line_;
    ++pos_;
    size_t base = items_.size();
    skip_spaces();
    if (!at_end() && text_[pos_] == ']') {
      ++pos_;
    } else {
      while (true) {
        skip_spaces();
        JsonValue value;
        parse_value(out ? &value : nullptr, depth);
        if (out) items_.push_back(std::move(value));
        skip_spaces();
        if (at_end()) fail_truncated("array", open_line);
        if (text_[pos_] == ']') {
          ++pos_;
          break;
        }
        if (text_[pos_] != ',')
          fail("expected ',' or ']' in the array opened at line " + std::to_string(open_line) + ", found " +
               describe_here());
        ++pos_;
      }
    }
    if (!out) return;
    out->kind = JsonKind::Array;
    auto first = items_.begin() + static_cast<std::ptrdiff_t>(base);
    out->items.assign(std::make_move_iterator(first), std::make_move_iterator(items_.end()));
    items_.erase(first, items_.end());
  }

  void parse_string(std::string& out) {
    ++pos_;
    while (true) {
      size_t run = pos_;
      while (run < text_.size() && text_[run] != '"' && text_[run] != '\\' &&
             static_cast<unsigned char>(text_[run]) >= 0x20)
        ++run;
      out.append(text_.data() + pos_, run - pos_);
      pos_ = run;
      if (at_end()) fail("the file ends inside a string (truncated?)");
      char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return;
      }
      if (c != '\\') {
        char code[8];
        std::snprintf(code, sizeof code, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(c)));
        fail(std::string("control character ") + code +
             " inside a string (unterminated string? line breaks and tabs must be written \\n and \\t)");
      }
      read_escape(out);
    }
  }

  void read_escape(std::string& out) {
    ++pos_;
    if (at_end()) fail("the file ends inside a string (truncated?)");
    char c = text_[pos_++];
    switch (c) {
      case '"': out += '"'; return;
      case '\\': out += '\\'; return;
      case '/': out += '/'; return;
      case 'b': out += '\b'; return;
      case 'f': out += '\f'; return;
      case 'n': out += '\n'; return;
      case 'r': out += '\r'; return;
      case 't': out += '\t'; return;
      case 'u': break;
      default: fail("invalid escape '\\" + std::string(1, c) + "' in a string");
    }
    uint32_t code = read_hex4();
    if (code >= 0xDC00 && code <= 0xDFFF) fail("lone low surrogate \\u" + hex4(code) + " in a string");
    if (code >= 0xD800 && code <= 0xDBFF) {
      // Characters beyond U+FFFF are written as a UTF-16 surrogate pair: \uD83D\uDE00.
      if (!literal("\\u")) fail("high surrogate \\u" + hex4(code) + " is not followed by a low surrogate \\uDC00-\\uDFFF");
      uint32_t low = read_hex4();
      if (low < 0xDC00 || low > 0xDFFF)
        fail("high surrogate \\u" + hex4(code) + " is followed by \\u" + hex4(low) + ", not a low surrogate");
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(out, code);
  }

  uint32_t read_hex4() {
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      char c = at_end() ? '\0' : text_[pos_];
      uint32_t digit;
      if (c >= '0' && c <= '9') {
        digit = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        fail("\\u must be followed by 4 hex digits");
      }
      code = code * 16 + digit;
    }
    return code;
  }

  static std::string hex4(uint32_t code) {
    char text[8];
    std::snprintf(text, sizeof text, "%04X", static_cast<unsigned>(code));
    return text;
  }

  // JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, checked here because
  // from_chars alone would also take "inf", "nan" and leading zeros. A magnitude a double
  // cannot hold (1e400, and 1e-400 too) is an error rather than a silent infinity or zero.
  void parse_number(JsonValue* out) {
    size_t begin = pos_;
    auto digits = [&](const char* after) {
      if (at_end() || !is_digit(text_[pos_])) fail(std::string("malformed number: expected a digit after ") + after);
      while (!at_end() && is_digit(text_[pos_])) ++pos_;
    };
    if (text_[pos_] == '-') ++pos_;
    if (!at_end() && text_[pos_] == '0') {
      ++pos_;
      if (!at_end() && is_digit(text_[pos_])) fail("malformed number: leading zero");
    } else {
      digits("'-'");
    }
    if (!at_end() && text_[pos_] == '.') {
      ++pos_;
      digits("'.'");
    }
    if (!at_end() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (!at_end() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      digits("the exponent 'e'");
    }
    if (!out) return;
    const char* first = text_.data() + begin;
    const char* last = text_.data() + pos_;
    auto [end, error] = std::from_chars(first, last, out->number);
    if (error != std::errc() || end != last)
      fail("number " + std::string(first, std::min<size_t>(last - first, 40)) + " is out of range for a double");
    out->kind = JsonKind::Number;
  }

  std::string_view text_;
  const std::string& file_;
  const JsonOptions& options_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<JsonValue> items_;     // elements of the arrays being parsed, innermost last
  std::vector<JsonMember> members_;  // members of the objects being parsed, innermost last
  std::string scratch_;              // the text of skipped strings
};

}  // namespace

JsonValue parse_json(std::string_view text, const std::string& file, const JsonOptions& options) {
  return JsonParser(text, file, options).parse_document();
}

JsonValue read_json_file(const std::string& path, const JsonOptions& options) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::streamoff size = in.tellg();
  if (size < 0) throw Error("cannot read " + path + ": not a regular file");
  std::string text(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(text.data(), size)) throw Error("cannot read " + path + ": " + std::strerror(errno));
  return parse_json(text, path, options);
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", static_cast<unsigned>(c));
      out += escape;
    } else {
      out += c;
    }
  }
  return out + '"';
}

}  // namespace yolo::data
