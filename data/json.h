// A small JSON reader (RFC 8259) for COCO annotation files, which can be hundreds of MB: one
// pass over the text held in memory; every value keeps its line so label errors can point at it.
// And the one thing JSON writers need from it: strings quoted and escaped.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace yolo::data {

enum class JsonKind : uint8_t { Null, Bool, Number, String, Array, Object };
const char* json_kind_name(JsonKind kind);  // "null", "a boolean", "a number", ... for messages

struct JsonMember;

struct JsonValue {
  JsonKind kind = JsonKind::Null;
  bool boolean = false;  // Bool
  int line = 0;          // where the value starts (1-based)
  double number = 0;     // Number
  std::string string;    // String, escapes decoded to UTF-8
  std::vector<JsonValue> items;     // Array
  std::vector<JsonMember> members;  // Object, in file order (repeated keys kept)

  const JsonValue* find(std::string_view key) const;  // the first member named `key`, or nullptr
};

struct JsonMember {
  std::string key;
  JsonValue value;
};

// Deeper nesting is an error: hostile input must not exhaust the stack.
constexpr int kJsonMaxDepth = 256;

struct JsonOptions {
  // Members with these keys, at any depth, are checked for syntax but not kept (COCO's
  // "segmentation" polygons are most of a 450 MB file and not needed for boxes).
  std::vector<std::string> skip_keys;
};

// Parses one JSON value filling the whole text. Malformed input throws yolo::Error
// "FILE:LINE: message", with `file` naming the document.
JsonValue parse_json(std::string_view text, const std::string& file, const JsonOptions& options = {});

// Reads the file at `path` into memory once and parses it (errors name it).
JsonValue read_json_file(const std::string& path, const JsonOptions& options = {});

// `text` as a JSON string: in double quotes, with '"', '\\' and control characters escaped (for
// writers of JSON whose strings come from users: file paths, class names).
std::string json_string(std::string_view text);

}  // namespace yolo::data
