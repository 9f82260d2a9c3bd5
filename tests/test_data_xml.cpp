// The XML and JSON readers behind the VOC and COCO formats: decoding (entities, CDATA, escapes,
// surrogate pairs, numbers), line numbers, the depth limit, and every error path with file:line.
#include <doctest/doctest.h>

#include <string>

#include "data/json.h"
#include "data/xml.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::data;
using namespace yolo::testing;

namespace {

// The error `parse` throws must start with "FILE:LINE: " and contain `fragment`.
template <typename Parse>
void check_error(Parse parse, const std::string& where, const std::string& fragment) {
  try {
    parse();
    FAIL("no error; expected one at " << where << " containing '" << fragment << "'");
  } catch (const Error& e) {
    std::string message = e.what();
    CHECK_MESSAGE(message.rfind(where + ": ", 0) == 0, message);
    CHECK_MESSAGE(message.find(fragment) != std::string::npos, message);
  }
}

void check_xml_error(const std::string& text, int line, const std::string& fragment) {
  CAPTURE(text);
  check_error([&] { parse_xml(text, "doc.xml"); }, "doc.xml:" + std::to_string(line), fragment);
}

void check_json_error(const std::string& text, int line, const std::string& fragment) {
  CAPTURE(text);
  check_error([&] { parse_json(text, "doc.json"); }, "doc.json:" + std::to_string(line), fragment);
}

std::string nested(const std::string& open, const std::string& inner, const std::string& close, int depth) {
  std::string text;
  for (int i = 0; i < depth; ++i) text += open;
  text += inner;
  for (int i = 0; i < depth; ++i) text += close;
  return text;
}

}  // namespace

TEST_CASE("xml: elements, attributes, text and line numbers") {
  std::string text =
      "\xEF\xBB\xBF<?xml version=\"1.0\" encoding=\"utf-8\"?>\n"
      "<!-- written by a labelling tool -->\n"
      "<annotation verified='yes' note=\"a &amp; b\">\n"
      "  <filename>img &lt;1&gt;.jpg</filename>\n"
      "  <size><width>17</width><height>9</height></size>\n"
      "  <object><name>dog</name><flag/></object>\n"
      "  <object >\n"
      "    <name>cat</name>\n"
      "  </object>\n"
      "</annotation>\n"
      "<!-- trailing comment -->\n";
  XmlElement root = parse_xml(text, "a.xml");
  CHECK(root.name == "annotation");
  CHECK(root.line == 3);
  REQUIRE(root.attributes.size() == 2);
  CHECK(*root.attribute("verified") == "yes");
  CHECK(*root.attribute("note") == "a & b");
  CHECK(root.attribute("missing") == nullptr);
  CHECK(*parse_xml("<a x='1' x='2'/>", "r.xml").attribute("x") == "1");  // repeated: the first counts
  REQUIRE(root.children.size() == 4);
  CHECK(root.child("filename")->text == "img <1>.jpg");
  CHECK(root.child("filename")->line == 4);
  const XmlElement* size = root.child("size");
  REQUIRE(size);
  CHECK(size->child("width")->trimmed_text() == "17");
  CHECK(size->child("height")->trimmed_text() == "9");
  CHECK(size->child("height")->line == 5);
  CHECK(root.child("nothing") == nullptr);
  const XmlElement& second = root.children[3];
  CHECK(second.name == "object");
  CHECK(second.line == 7);
  CHECK(second.child("name")->line == 8);
  CHECK(second.child("name")->text == "cat");
  CHECK(root.children[2].child("flag")->children.empty());
  CHECK(root.children[2].child("flag")->text.empty());
  CHECK(second.text == "\n    \n  ");  // only the element's own character data
  CHECK(second.trimmed_text().empty());
}

TEST_CASE("xml: CDATA, character references, comments and processing instructions inside elements") {
  std::string text =
      "<!DOCTYPE annotation [ <!ENTITY x \"y>\"> ]>\n"
      "<a>x<![CDATA[<not & a tag>]]>y<!-- c -->z<?pi stuff?>"
      "&#65;&#x42;&#xe9;&#x20AC;&#x1F600;&quot;&apos;</a>";
  XmlElement root = parse_xml(text, "b.xml");
  CHECK(root.name == "a");
  CHECK(root.line == 2);
  CHECK(root.text ==
        "x<not & a tag>yz"
        "AB\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"'");
}

TEST_CASE("xml: nesting up to the depth limit is read, one level more is an error") {
  XmlElement root = parse_xml(nested("<e>", "deep", "</e>", kXmlMaxDepth), "deep.xml");
  const XmlElement* e = &root;
  int depth = 1;
  while (!e->children.empty()) {
    e = &e->children[0];
    ++depth;
  }
  CHECK(depth == kXmlMaxDepth);
  CHECK(e->text == "deep");
  check_xml_error(nested("<e>", "", "</e>", kXmlMaxDepth + 1), 1, "nested deeper than 256");
  // Hostile depth far beyond the limit stops at the limit instead of exhausting the stack.
  check_xml_error(nested("<e>\n", "", "</e>", 100000), kXmlMaxDepth + 1, "nested deeper");
}

TEST_CASE("xml: every malformed input is an error naming file and line") {
  check_xml_error("", 1, "no root element");
  check_xml_error("  \n \n", 3, "no root element");
  check_xml_error("<?xml version='1.0'?>\n<!-- only a comment -->\n", 3, "no root element");
  check_xml_error("hello <a/>", 1, "expected the root element, found 'hello <a/>'");
  check_xml_error("\x89PNG\r\n\x1a\n", 1, "expected the root element");
  check_xml_error("<a>\n<b>\n</a>", 3, "</a> does not match <b> opened at line 2");
  check_xml_error("<a>\n<b>text", 2, "the file ends before </b> (the element opened at line 2; truncated?)");
  check_xml_error("<a>\n</a>\n<b/>", 3, "unexpected content after the root element <a>");
  check_xml_error("<a/>\ntext", 2, "unexpected content after the root element");
  check_xml_error("<a/><!DOCTYPE a>", 1, "unexpected content after the root element");
  check_xml_error("<a>\nfish & chips</a>", 2, "'&' does not start an entity");
  check_xml_error("<a>&nbsp;</a>", 1, "unknown entity '&nbsp;'");
  check_xml_error("<a>&;</a>", 1, "unknown entity '&;'");
  check_xml_error("<a>&#0;</a>", 1, "'&#0;' is not a character XML allows");
  check_xml_error("<a>&#xD800;</a>", 1, "is not a character XML allows");
  check_xml_error("<a>&#x110000;</a>", 1, "is not a character XML allows");
  check_xml_error("<a>&#99999999;</a>", 1, "is not a character XML allows");
  check_xml_error("<a>&#12a;</a>", 1, "malformed character reference '&#12a;'");
  check_xml_error("<a>&#;</a>", 1, "empty character reference");
  check_xml_error("<a>&#x;</a>", 1, "empty character reference");
  check_xml_error("<a x=1/>", 1, "expected a quoted attribute value, found '1/>'");
  check_xml_error("<a x/>", 1, "expected '=' after the attribute x");
  check_xml_error("<a x='1'y='2'/>", 1, "expected a space, '>' or '/>' in the tag <a>");
  check_xml_error("<a x='<'/>", 1, "'<' inside an attribute value");
  check_xml_error("<a x='1&bad;'/>", 1, "unknown entity '&bad;'");
  check_xml_error("<a x='\n1", 2, "the file ends inside the attribute value opened at line 1");
  check_xml_error("<a\n", 2, "the file ends inside the tag <a>");
  check_xml_error("<a>\n<!-- open", 2, "the file ends inside a comment opened at line 2");
  check_xml_error("<a><![CDATA[\nxx", 2, "the file ends inside a CDATA section opened at line 1");
  check_xml_error("<?xml \n", 2, "the file ends inside the processing instruction");
  check_xml_error("<!DOCTYPE a [\n<!ENTITY b '>'>\n", 3, "the file ends inside the <!DOCTYPE> opened at line 1");
  check_xml_error("<a>< b</a>", 1, "unexpected '< b</a>' inside <a>");
  check_xml_error("<a><!ELEMENT></a>", 1, "unexpected '<!ELEMENT></' inside <a>");
  check_xml_error("<a></a x>", 1, "expected '>' to end </a>");
  check_xml_error("<a></>", 1, "expected an element name after '</'");
  check_xml_error("<a><1b/></a>", 1, "unexpected '<1b/></a>' inside <a>");
  check_xml_error("<a =''/>", 1, "expected an attribute name, found '=''/>'");
}

TEST_CASE("xml: read_xml_file names the file") {
  TempDir dir;
  write_text_file(dir / "ok.xml", "<a>\n<b>1</b>\n</a>\n");
  XmlElement root = read_xml_file(dir / "ok.xml");
  CHECK(root.child("b")->text == "1");
  CHECK(root.child("b")->line == 2);
  write_text_file(dir / "bad.xml", "<a>\n<b>1</c>\n</a>\n");
  check_error([&] { read_xml_file(dir / "bad.xml"); }, dir / "bad.xml:2", "</c> does not match <b>");
  CHECK_THROWS_WITH_AS(read_xml_file(dir / "none.xml"), doctest::Contains("none.xml"), Error);
}

TEST_CASE("json: values of every kind, with their lines") {
  std::string text =
      "{\n"
      "  \"images\": [ {\"id\": 7, \"file_name\": \"a.jpg\"},\n"
      "              {\"id\": -3} ],\n"
      "  \"flag\": true, \"off\": false,\n"
      "  \"nothing\": null,\n"
      "  \"empty\": {}, \"list\": [],\n"
      "  \"dup\": 1, \"dup\": 2\n"
      "}";
  JsonValue root = parse_json(text, "a.json");
  REQUIRE(root.kind == JsonKind::Object);
  CHECK(root.line == 1);
  REQUIRE(root.members.size() == 8);
  CHECK(root.members[0].key == "images");
  const JsonValue* images = root.find("images");
  REQUIRE(images);
  CHECK(images->kind == JsonKind::Array);
  CHECK(images->line == 2);
  REQUIRE(images->items.size() == 2);
  CHECK(images->items[0].find("id")->number == 7);
  CHECK(images->items[0].find("file_name")->string == "a.jpg");
  CHECK(images->items[0].find("file_name")->kind == JsonKind::String);
  CHECK(images->items[1].line == 3);
  CHECK(images->items[1].find("id")->number == -3);
  CHECK(images->items[1].find("id")->line == 3);
  CHECK(root.find("flag")->kind == JsonKind::Bool);
  CHECK(root.find("flag")->boolean);
  CHECK(root.find("off")->kind == JsonKind::Bool);
  CHECK_FALSE(root.find("off")->boolean);
  CHECK(root.find("off")->line == 4);
  CHECK(root.find("nothing")->kind == JsonKind::Null);
  CHECK(root.find("nothing")->line == 5);
  CHECK(root.find("empty")->kind == JsonKind::Object);
  CHECK(root.find("empty")->members.empty());
  CHECK(root.find("list")->kind == JsonKind::Array);
  CHECK(root.find("list")->items.empty());
  CHECK(root.find("dup")->number == 1);  // repeated keys are kept; find gives the first
  CHECK(root.find("absent") == nullptr);
  CHECK(std::string(json_kind_name(JsonKind::Array)) == "an array");

  JsonValue scalar = parse_json("\r\n\t 42 \n", "s.json");
  CHECK(scalar.kind == JsonKind::Number);
  CHECK(scalar.number == 42);
  CHECK(scalar.line == 2);
}

TEST_CASE("json: string escapes, \\u and surrogate pairs become UTF-8") {
  JsonValue v = parse_json(R"(["q\"b\\s\/\b\f\n\r\t", "\u00e9\u20AC\uD83D\uDE00", "a\u0000b", "plain \u00C9t\u00e9"])",
                           "s.json");
  REQUIRE(v.items.size() == 4);
  CHECK(v.items[0].string == "q\"b\\s/\b\f\n\r\t");
  CHECK(v.items[1].string == "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  CHECK(v.items[2].string == std::string("a\0b", 3));
  CHECK(v.items[3].string == "plain \xC3\x89t\xC3\xA9");
  CHECK(parse_json("\"\xC3\xA9 raw UTF-8\"", "u.json").string == "\xC3\xA9 raw UTF-8");
}

TEST_CASE("json: numbers") {
  JsonValue v = parse_json("[0, -0, 12, -3.5, 1e3, 2.5E-2, -1.25e+2, 0.1, 1.7976931348623157e308, 123456789012]",
                           "n.json");
  REQUIRE(v.items.size() == 10);
  double expected[] = {0, -0.0, 12, -3.5, 1000, 0.025, -125, 0.1, 1.7976931348623157e308, 123456789012.0};
  for (size_t i = 0; i < 10; ++i) {
    CAPTURE(i);
    CHECK(v.items[i].kind == JsonKind::Number);
    CHECK(v.items[i].number == expected[i]);
  }
}

TEST_CASE("json: skipped keys are checked but not kept") {
  JsonOptions options;
  options.skip_keys = {"segmentation"};
  JsonValue v = parse_json(
      "[{\"id\": 1, \"segmentation\": [[1, 2.5, {\"counts\": \"x\\u0041\"}]], \"bbox\": [1, 2, 3, 4]},\n"
      " {\"segmentation\": \"s\", \"id\": 2}]",
      "k.json", options);
  REQUIRE(v.items.size() == 2);
  REQUIRE(v.items[0].members.size() == 2);
  CHECK(v.items[0].members[0].key == "id");
  CHECK(v.items[0].members[1].key == "bbox");
  CHECK(v.items[0].find("bbox")->items[3].number == 4);
  CHECK(v.items[0].find("segmentation") == nullptr);
  REQUIRE(v.items[1].members.size() == 1);
  CHECK(v.items[1].find("id")->number == 2);
  CHECK(v.items[1].line == 2);
  // A skipped value is still parsed: its errors are reported.
  check_error([&] { parse_json("{\"segmentation\": [1,\n 2,,]}", "k.json", options); }, "k.json:2",
              "expected a value, found ',]}'");
  check_error([&] { parse_json("{\"segmentation\": \"\\q\"}", "k.json", options); }, "k.json:1", "invalid escape");
}

TEST_CASE("json: nesting up to the depth limit is read, one level more is an error") {
  JsonValue v = parse_json(nested("[", "1", "]", kJsonMaxDepth), "d.json");
  int depth = 0;
  const JsonValue* e = &v;
  while (e->kind == JsonKind::Array) {
    e = &e->items[0];
    ++depth;
  }
  CHECK(depth == kJsonMaxDepth);
  CHECK(e->number == 1);
  check_json_error(nested("[", "", "]", kJsonMaxDepth + 1), 1, "nested deeper than 256 levels");
  check_json_error(nested("{\"a\":", "1", "}", kJsonMaxDepth + 1), 1, "nested deeper than 256 levels");
  check_json_error(nested("[\n", "", "]", 100000), kJsonMaxDepth + 1, "nested deeper");
}

TEST_CASE("json: every malformed input is an error naming file and line") {
  check_json_error("", 1, "empty file");
  check_json_error("\n \n", 3, "empty file");
  check_json_error("hello", 1, "expected a value, found 'hello'");
  check_json_error("{\"a\": 1}\n{}", 2, "unexpected '{}' after the JSON value that starts at line 1");
  check_json_error("{\"a\":\n [1, 2", 2, "the file ends inside the array opened at line 2 (truncated?)");
  check_json_error("{\"a\":\n [1, 2,", 2, "the file ends where a value was expected");
  check_json_error("{\n\"a\": 1\n", 3, "the file ends inside the object opened at line 1");
  check_json_error("{\n\"a\": 1,", 2, "the file ends inside the object opened at line 1");
  check_json_error("{\n\"a\"", 2, "the file ends inside the object opened at line 1");
  check_json_error("{\n\"a\"\n  1}", 3, "expected ':' after the member name \"a\", found '1}'");
  check_json_error("{\"a\": 1 \"b\": 2}", 1, "expected ',' or '}' in the object opened at line 1, found '\"b\": 2}'");
  check_json_error("[1 2]", 1, "expected ',' or ']' in the array opened at line 1");
  check_json_error("{\"a\": 1,}", 1, "expected a member name in double quotes, found '}'");
  check_json_error("{a: 1}", 1, "expected a member name in double quotes");
  check_json_error("[1,]", 1, "expected a value, found ']'");
  check_json_error("[tru]", 1, "expected a value, found 'tru]'");
  check_json_error("[nul", 1, "expected a value");
  check_json_error("[01]", 1, "malformed number: leading zero");
  check_json_error("[-]", 1, "malformed number: expected a digit after '-'");
  check_json_error("[-a]", 1, "malformed number");
  check_json_error("[1.]", 1, "malformed number: expected a digit after '.'");
  check_json_error("[1e]", 1, "malformed number: expected a digit after the exponent");
  check_json_error("[1e+]", 1, "malformed number: expected a digit after the exponent");
  check_json_error("[.5]", 1, "expected a value, found '.5]'");
  check_json_error("[+1]", 1, "expected a value");
  check_json_error("[1e400]", 1, "number 1e400 is out of range");
  check_json_error("[-1e400]", 1, "out of range");
  check_json_error("[1e-400]", 1, "out of range");
  check_json_error("[\"abc", 1, "the file ends inside a string");
  check_json_error("[\"abc\\", 1, "the file ends inside a string");
  check_json_error("[\"abc\n\"]", 1, "control character 0x0A inside a string");
  check_json_error("[\"a\tb\"]", 1, "control character 0x09");
  check_json_error("[\"\\x\"]", 1, "invalid escape '\\x'");
  check_json_error("[\"\\u12G4\"]", 1, "\\u must be followed by 4 hex digits");
  check_json_error("[\"\\u12", 1, "\\u must be followed by 4 hex digits");
  check_json_error("[\"\\uDE00\"]", 1, "lone low surrogate \\uDE00");
  check_json_error("[\"\\uD83D\"]", 1, "high surrogate \\uD83D is not followed by a low surrogate");
  check_json_error("[\"\\uD83Dx\"]", 1, "high surrogate \\uD83D is not followed by a low surrogate");
  check_json_error("[\"\\uD83D\\u0041\"]", 1, "high surrogate \\uD83D is followed by \\u0041, not a low surrogate");
  check_json_error("\x1f\x8b\x08", 1, "expected a value");
}

TEST_CASE("json: read_json_file names the file") {
  TempDir dir;
  write_text_file(dir / "ok.json", "{\"a\": [1, 2]}");
  CHECK(read_json_file(dir / "ok.json").find("a")->items[1].number == 2);
  write_text_file(dir / "empty.json", "");
  check_error([&] { read_json_file(dir / "empty.json"); }, dir / "empty.json:1", "empty file");
  write_text_file(dir / "cut.json", "{\"images\": [\n{\"id\": 1},\n{\"id\": ");
  check_error([&] { read_json_file(dir / "cut.json"); }, dir / "cut.json:3", "the file ends where a value was expected");
  CHECK_THROWS_WITH_AS(read_json_file(dir / "none.json"), doctest::Contains("none.json"), Error);
}

TEST_CASE("xml and json: every truncation is an error, random corruption never crashes") {
  const std::string xml =
      "<?xml version=\"1.0\"?>\n<!-- c -->\n<annotation a=\"&amp;x\">\n<name>d&#x41;g<![CDATA[<]]></name>\n"
      "<size><width>5</width></size><flag/>\n</annotation>";
  const std::string json =
      "{\"images\": [{\"id\": 1, \"file_name\": \"a\\u00e9\\uD83D\\uDE00.jpg\", \"w\": -1.5e+2}],\n"
      "\"ok\": [true, false, null, {}, []]}";
  for (size_t n = 0; n < xml.size(); ++n) CHECK_THROWS_AS(parse_xml(xml.substr(0, n), "t.xml"), Error);
  for (size_t n = 0; n < json.size(); ++n) CHECK_THROWS_AS(parse_json(json.substr(0, n), "t.json"), Error);
  Rng rng;
  CAPTURE(rng.seed());
  const char bytes[] = "<>/&;\"'[]{}:,\\-!?x0 \n\x80\xff";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string x = xml, j = json;
    for (int k = rng.integer(1, 4); k > 0; --k) {
      x[size_t(rng.integer(0, int(x.size()) - 1))] = bytes[rng.integer(0, int(sizeof bytes) - 2)];
      j[size_t(rng.integer(0, int(j.size()) - 1))] = bytes[rng.integer(0, int(sizeof bytes) - 2)];
    }
    try {
      parse_xml(x, "t.xml");
    } catch (const Error&) {
    }
    try {
      parse_json(j, "t.json");
    } catch (const Error&) {
    }
  }
}
