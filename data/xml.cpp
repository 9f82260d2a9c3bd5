// The XML reader of xml.h: a recursive-descent parser over the whole text, tracking the line
// for error messages. Document type declarations and processing instructions are skipped.
#include "data/xml.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "data/utf8.h"
#include "runtime/check.h"

namespace yolo::data {

const XmlElement* XmlElement::child(std::string_view child_name) const {
  for (const XmlElement& c : children)
    if (c.name == child_name) return &c;
  return nullptr;
}

const std::string* XmlElement::attribute(std::string_view attribute_name) const {
  for (const auto& [key, value] : attributes)
    if (key == attribute_name) return &value;
  return nullptr;
}

std::string_view XmlElement::trimmed_text() const {
  std::string_view t = text;
  size_t begin = t.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  size_t end = t.find_last_not_of(" \t\r\n");
  return t.substr(begin, end - begin + 1);
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// Names as XML allows them, with every non-ASCII byte accepted (UTF-8 names).
bool is_name_start(char c) {
  auto u = static_cast<unsigned char>(c);
  return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_' || u == ':' || u >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

// The characters XML documents may contain (the Char production of the XML 1.0 spec).
bool is_xml_char(uint32_t c) {
  return c == 0x9 || c == 0xA || c == 0xD || (c >= 0x20 && c <= 0xD7FF) || (c >= 0xE000 && c <= 0xFFFD) ||
         (c >= 0x10000 && c <= 0x10FFFF);
}

class XmlParser {
 public:
  XmlParser(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  XmlElement parse_document() {
    if (starts_with("\xEF\xBB\xBF")) pos_ += 3;  // UTF-8 byte order mark
    XmlElement root;
    bool have_root = false;
    while (true) {
      skip_spaces();
      if (at_end()) break;
      if (starts_with("<?")) {
        skip_processing_instruction();
      } else if (starts_with("<!--")) {
        skip_comment();
      } else if (starts_with("<!DOCTYPE") && !have_root) {
        skip_doctype();
      } else if (have_root) {
        fail("unexpected content after the root element <" + root.name + "> (opened at line " +
             std::to_string(root.line) + ")");
      } else if (starts_with("<") && pos_ + 1 < text_.size() && is_name_start(text_[pos_ + 1])) {
        parse_element(root, 1);
        have_root = true;
      } else {
        fail("expected the root element, found " + describe_here());
      }
    }
    if (!have_root) fail("no root element (empty or not an XML file)");
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { fail_at(file_.c_str(), line_, message); }

  bool at_end() const { return pos_ >= text_.size(); }
  bool starts_with(std::string_view s) const { return text_.substr(pos_).starts_with(s); }

  // What is at the current position, for messages: a short quoted excerpt.
  std::string describe_here() const {
    if (at_end()) return "the end of the file";
    std::string excerpt;
    for (size_t i = pos_; i < text_.size() && i < pos_ + 12 && text_[i] != '\n'; ++i)
      excerpt += static_cast<unsigned char>(text_[i]) < 0x20 ? '?' : text_[i];
    return "'" + excerpt + "'";
  }

  void advance(size_t n) {
    for (size_t end = pos_ + n; pos_ < end; ++pos_)
      if (text_[pos_] == '\n') ++line_;
  }

  void skip_spaces() {
    while (!at_end() && is_space(text_[pos_])) advance(1);
  }

  // Consumes everything up to and including `terminator`; `what` names the construct opened
  // at the current line for the error when the file ends first.
  std::string_view skip_through(std::string_view terminator, const char* what) {
    int start_line = line_;
    size_t end = text_.find(terminator, pos_);
    if (end == std::string_view::npos) {
      advance(text_.size() - pos_);
      fail(std::string("the file ends inside ") + what + " opened at line " + std::to_string(start_line) +
           " (truncated?)");
    }
    std::string_view inside = text_.substr(pos_, end - pos_);
    advance(end - pos_ + terminator.size());
    return inside;
  }

  void skip_processing_instruction() { skip_through("?>", "the processing instruction '<?'"); }
  void skip_comment() {
    advance(4);
    skip_through("-->", "a comment");
  }

  // <!DOCTYPE ...> with an optional internal subset in brackets, which may itself hold '>'.
  void skip_doctype() {
    int start_line = line_;
    int brackets = 0;
    char quote = 0;
    for (advance(2); !at_end(); advance(1)) {
      char c = text_[pos_];
      if (quote) {
        if (c == quote) quote = 0;
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '[') {
        ++brackets;
      } else if (c == ']') {
        --brackets;
      } else if (c == '>' && brackets <= 0) {
        advance(1);
        return;
      }
    }
    fail("the file ends inside the <!DOCTYPE> opened at line " + std::to_string(start_line) + " (truncated?)");
  }

  std::string read_name(const char* what) {
    if (at_end() || !is_name_start(text_[pos_])) fail(std::string("expected ") + what + ", found " + describe_here());
    size_t begin = pos_;
    while (!at_end() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(begin, pos_ - begin));
  }

  // After '&': one of the five predefined entities or a character reference, appended to out.
  void read_reference(std::string& out) {
    advance(1);
    size_t semicolon = text_.find(';', pos_);
    constexpr size_t kLongestReference = 10;  // "#x10FFFF" with some slack for leading zeros
    if (semicolon == std::string_view::npos || semicolon - pos_ > kLongestReference)
      fail("'&' does not start an entity such as &amp; (a literal '&' must be written &amp;)");
    std::string_view ref = text_.substr(pos_, semicolon - pos_);
    if (ref == "lt") {
      out += '<';
    } else if (ref == "gt") {
      out += '>';
    } else if (ref == "amp") {
      out += '&';
    } else if (ref == "apos") {
      out += '\'';
    } else if (ref == "quot") {
      out += '"';
    } else if (!ref.empty() && ref[0] == '#') {
      append_utf8(out, character_reference(ref));
    } else {
      fail("unknown entity '&" + std::string(ref) + ";' (XML predefines only &lt; &gt; &amp; &apos; &quot;)");
    }
    advance(ref.size() + 1);
  }

  // "#123" or "#x7B" -> the code point, which must be a character XML allows.
  uint32_t character_reference(std::string_view ref) {
    bool hex = ref.size() > 1 && ref[1] == 'x';
    std::string_view digits = ref.substr(hex ? 2 : 1);
    if (digits.empty()) fail("empty character reference '&" + std::string(ref) + ";'");
    uint32_t value = 0;
    for (char c : digits) {
      int digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (hex && c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (hex && c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        fail("malformed character reference '&" + std::string(ref) + ";'");
      }
      value = value * (hex ? 16 : 10) + static_cast<uint32_t>(digit);
      if (value > 0x10FFFF) break;  // already invalid; stopping here keeps it from wrapping
    }
    if (!is_xml_char(value))
      fail("character reference '&" + std::string(ref) + ";' is not a character XML allows");
    return value;
  }

  void read_attribute_value(std::string& out) {
    if (at_end() || (text_[pos_] != '"' && text_[pos_] != '\''))
      fail("expected a quoted attribute value, found " + describe_here());
    char quote = text_[pos_];
    int start_line = line_;
    advance(1);
    while (true) {
      if (at_end())
        fail("the file ends inside the attribute value opened at line " + std::to_string(start_line) +
             " (truncated?)");
      char c = text_[pos_];
      if (c == quote) break;
      if (c == '<') fail("'<' inside an attribute value (write &lt;)");
      if (c == '&') {
        read_reference(out);
      } else {
        out += c;
        advance(1);
      }
    }
    advance(1);
  }

  // At '<' of a start tag: reads the element with its attributes and content, through its end tag.
  void parse_element(XmlElement& element, int depth) {
    if (depth > kXmlMaxDepth) fail("elements nested deeper than " + std::to_string(kXmlMaxDepth) + " levels");
    element.line = line_;
    advance(1);
    element.name = read_name("an element name");
    while (true) {
      bool spaced = !at_end() && is_space(text_[pos_]);
      skip_spaces();
      if (at_end()) fail("the file ends inside the tag <" + element.name + "> (truncated?)");
      if (starts_with("/>")) {
        advance(2);
        return;
      }
      if (text_[pos_] == '>') {
        advance(1);
        break;
      }
      if (!spaced) fail("expected a space, '>' or '/>' in the tag <" + element.name + ">, found " + describe_here());
      std::string name = read_name("an attribute name");
      skip_spaces();
      if (at_end() || text_[pos_] != '=')
        fail("expected '=' after the attribute " + name + ", found " + describe_here());
      advance(1);
      skip_spaces();
      std::string value;
      read_attribute_value(value);
      element.attributes.emplace_back(std::move(name), std::move(value));
    }
    parse_content(element, depth);
  }

  // Text, children, comments and CDATA up to and including the element's end tag.
  void parse_content(XmlElement& element, int depth) {
    while (true) {
      if (at_end())
        fail("the file ends before </" + element.name + "> (the element opened at line " +
             std::to_string(element.line) + "; truncated?)");
      char c = text_[pos_];
      if (c == '&') {
        read_reference(element.text);
      } else if (c != '<') {
        size_t end = std::min(text_.find_first_of("<&", pos_), text_.size());
        element.text += text_.substr(pos_, end - pos_);
        advance(end - pos_);
      } else if (starts_with("</")) {
        advance(2);
        std::string name = read_name("an element name after '</'");
        skip_spaces();
        if (at_end() || text_[pos_] != '>') fail("expected '>' to end </" + name + ">, found " + describe_here());
        if (name != element.name)
          fail("</" + name + "> does not match <" + element.name + "> opened at line " + std::to_string(element.line));
        advance(1);
        return;
      } else if (starts_with("<!--")) {
        skip_comment();
      } else if (starts_with("<![CDATA[")) {
        advance(9);
        element.text += skip_through("]]>", "a CDATA section");
      } else if (starts_with("<?")) {
        skip_processing_instruction();
      } else if (pos_ + 1 < text_.size() && is_name_start(text_[pos_ + 1])) {
        element.children.emplace_back();
        parse_element(element.children.back(), depth + 1);
      } else {
        fail("unexpected " + describe_here() + " inside <" + element.name + "> (a literal '<' must be written &lt;)");
      }
    }
  }

  std::string_view text_;
  const std::string& file_;
  size_t pos_ = 0;
  int line_ = 1;
};

}  // namespace

XmlElement parse_xml(std::string_view text, const std::string& file) { return XmlParser(text, file).parse_document(); }

XmlElement read_xml_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_xml(text.str(), path);
}

}  // namespace yolo::data
