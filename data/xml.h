// A small XML reader, enough for annotation files (Pascal VOC): elements, attributes, text,
// comments, CDATA and entities. Each element keeps its line, so label errors can point at it.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace yolo::data {

struct XmlElement {
  std::string name;
  int line = 0;  // where the start tag begins (1-based)
  // In file order, values decoded. A repeated name is kept (no quadratic check on hostile
  // input); attribute() gives the first.
  std::vector<std::pair<std::string, std::string>> attributes;
  std::string text;  // character data directly inside (entities and CDATA decoded); children's text excluded
  std::vector<XmlElement> children;

  const XmlElement* child(std::string_view child_name) const;           // the first such child, or nullptr
  const std::string* attribute(std::string_view attribute_name) const;  // its value, or nullptr
  std::string_view trimmed_text() const;                                // text without surrounding whitespace
};

// Deeper nesting is an error: hostile input must not exhaust the stack.
constexpr int kXmlMaxDepth = 256;

// Parses a whole document and returns its root element. Malformed input throws yolo::Error
// "FILE:LINE: message", with `file` naming the document.
XmlElement parse_xml(std::string_view text, const std::string& file);

// Reads and parses the file at `path` (errors name it).
XmlElement read_xml_file(const std::string& path);

}  // namespace yolo::data
