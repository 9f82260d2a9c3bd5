// Pascal VOC (imageai's layout): exact box values from 1-based inclusive corners, the difficult
// flag, class names collected and sorted or fixed by a names file, image path resolution,
// sizes read from the image when <size> is absent, and errors naming the XML file and line.
#include <doctest/doctest.h>

#include <string>

#include "data/dataset.h"
#include "data/image.h"
#include "runtime/check.h"
#include "tests/data_checks.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::data;
using namespace yolo::testing;

namespace {

// An annotation: <filename> and <size> (when width > 0), then each object line by line as given.
std::string voc_file(const std::string& filename, int width, int height, const std::string& objects) {
  std::string xml = "<annotation>\n  <folder>images</folder>\n  <filename>" + filename + "</filename>\n";
  if (width > 0)
    xml += "  <size><width>" + std::to_string(width) + "</width><height>" + std::to_string(height) +
           "</height><depth>3</depth></size>\n";
  return xml + objects + "</annotation>\n";
}

// One object on a single line.
std::string object(const std::string& name, const std::string& xmin, const std::string& ymin, const std::string& xmax,
                   const std::string& ymax, const std::string& extra = "") {
  return "  <object><name>" + name + "</name>" + extra + "<bndbox><xmin>" + xmin + "</xmin><ymin>" + ymin +
         "</ymin><xmax>" + xmax + "</xmax><ymax>" + ymax + "</ymax></bndbox></object>\n";
}

void make_split(const TempDir& dir, const std::string& split) {
  std::filesystem::create_directories(dir / (split + "/images"));
  std::filesystem::create_directories(dir / (split + "/annotations"));
}

// read_voc must leave the file's item out with a problem starting "WHERE: " and containing
// `fragment` (every other file still read).
void check_voc_error(const TempDir& dir, const OpenOptions& options, const std::string& where,
                     const std::string& fragment) {
  OpenOptions with_names = options;
  if (with_names.names_file.empty()) {  // the classes cannot be collected when the only file is bad
    with_names.names_file = dir / "check.names";
    write_text_file(with_names.names_file, "x\n");
  }
  Dataset d = read_voc(dir.path(), with_names);
  std::string all;
  bool found = false;
  for (const Problem& p : d.train.problems) {
    all += p.message + "\n";
    found = found || (p.item && p.message.rfind(where + ": ", 0) == 0 && p.message.find(fragment) != std::string::npos);
  }
  CHECK_MESSAGE(found, "expected a problem at " << where << " with '" << fragment << "'; got:\n" << all);
}

}  // namespace

TEST_CASE("voc: boxes from 1-based inclusive corners, difficult flag, classes collected and sorted") {
  TempDir dir;
  make_split(dir, "train");
  make_split(dir, "validation");
  // b.xml is listed second although written first: samples follow the file names.
  write_text_file(dir / "train/annotations/b.xml",
                  voc_file("b.jpg", 17, 9,
                           object("zebra", "1", "1", "17", "9") +
                               object("dog", "3.0", "2", "10.0", "6", "<difficult>1</difficult>")));
  write_text_file(dir / "train/annotations/a.xml",
                  voc_file("a.jpg", 10, 20, object(" cat ", "2", "4", "5", "13", "<difficult>0</difficult>")));
  write_text_file(dir / "train/annotations/notes.txt", "not an annotation");
  write_text_file(dir / "validation/annotations/v.xml", voc_file("v.jpg", 8, 8, object("Apple", "1", "1", "4", "8")));

  Dataset d = read_voc(dir.path(), {});
  CHECK(d.format == Format::Voc);
  CHECK(d.class_names == std::vector<std::string>{"Apple", "cat", "dog", "zebra"});
  CHECK(d.train.name == "train");
  CHECK(d.valid.name == "valid");
  REQUIRE(d.train.samples.size() == 2);
  CHECK(d.train.samples[0].image == dir / "train/images/a.jpg");
  CHECK(d.train.samples[1].image == dir / "train/images/b.jpg");

  REQUIRE(d.train.samples[0].boxes.size() == 1);
  // a.xml: x 2..5 of 10 -> continuous [1, 5]; y 4..13 of 20 -> [3, 13].
  check_box(d.train.samples[0].boxes[0], 3.0 / 10, 8.0 / 20, 4.0 / 10, 10.0 / 20, 1, false);
  REQUIRE(d.train.samples[1].boxes.size() == 2);
  check_box(d.train.samples[1].boxes[0], 0.5, 0.5, 1, 1, 3, false);  // the whole 17x9 image
  // x 3..10 of 17 -> [2, 10]; y 2..6 of 9 -> [1, 6].
  check_box(d.train.samples[1].boxes[1], 6.0 / 17, 3.5 / 9, 8.0 / 17, 5.0 / 9, 2, true);
  CHECK(d.train.counts.images == 2);
  CHECK(d.train.counts.boxes == 3);
  CHECK(d.train.counts.difficult_boxes == 1);
  CHECK(d.train.counts.clipped_boxes == 0);

  REQUIRE(d.valid.samples.size() == 1);
  CHECK(d.valid.samples[0].image == dir / "validation/images/v.jpg");
  REQUIRE(d.valid.samples[0].boxes.size() == 1);
  check_box(d.valid.samples[0].boxes[0], 2.0 / 8, 0.5, 4.0 / 8, 1, 0, false);
  CHECK(d.valid.counts.images == 1);
  CHECK(d.valid.counts.boxes == 1);

  CHECK(d.description.find("Pascal VOC at " + dir.path()) == 0);
  CHECK(d.description.find("4 classes collected from the annotations, sorted") != std::string::npos);
  CHECK(d.description.find("train: " + (dir / "train")) != std::string::npos);
}

TEST_CASE("voc: a names file fixes the class order; an unknown name is an error with file and line") {
  TempDir dir;
  make_split(dir, "train");
  make_split(dir, "val");  // "val" is accepted for the validation split too
  write_text_file(dir / "train/annotations/a.xml",
                  voc_file("a.jpg", 10, 10, object("cat", "1", "1", "10", "10") + object("dog", "1", "1", "5", "5")));
  write_text_file(dir / "val/annotations/b.xml", voc_file("b.jpg", 10, 10, object("bird", "1", "1", "10", "10")));
  write_text_file(dir / "names.txt", "dog\nbird\n\ncat\nunused\n");
  OpenOptions options;
  options.names_file = dir / "names.txt";
  Dataset d = read_voc(dir.path(), options);
  CHECK(d.class_names == std::vector<std::string>{"dog", "bird", "cat", "unused"});
  REQUIRE(d.train.samples.size() == 1);
  REQUIRE(d.train.samples[0].boxes.size() == 2);
  CHECK(d.train.samples[0].boxes[0].class_id == 2);
  CHECK(d.train.samples[0].boxes[1].class_id == 0);
  REQUIRE(d.valid.samples.size() == 1);
  CHECK(d.valid.samples[0].image == dir / "val/images/b.jpg");
  CHECK(d.valid.samples[0].boxes.at(0).class_id == 1);
  CHECK(d.description.find("4 classes from " + options.names_file) != std::string::npos);

  // Line 6: the second object's <name> (each object is written on one line).
  write_text_file(dir / "train/annotations/c.xml",
                  voc_file("c.jpg", 10, 10, object("cat", "1", "1", "2", "2") + object("horse", "1", "1", "2", "2")));
  check_voc_error(dir, options, dir / "train/annotations/c.xml:6", "class 'horse' is not in the names file");
}

TEST_CASE("voc: a class only in the validation split is reported with its file and line") {
  TempDir dir;
  make_split(dir, "train");
  make_split(dir, "validation");
  write_text_file(dir / "train/annotations/a.xml", voc_file("a.jpg", 10, 10, object("cat", "1", "1", "5", "5")));
  write_text_file(dir / "validation/annotations/v1.xml",
                  voc_file("v1.jpg", 10, 10, object("cat", "1", "1", "5", "5") + object("Cat", "2", "2", "6", "6")));
  write_text_file(dir / "validation/annotations/v2.xml", voc_file("v2.jpg", 10, 10, object("Cat", "1", "1", "4", "4")));

  Dataset d = read_voc(dir.path(), {});
  CHECK(d.class_names == std::vector<std::string>{"Cat", "cat"});  // still a class, now a reported one
  CHECK(d.valid.samples.size() == 2);
  CHECK(d.train.problems.empty());
  REQUIRE(d.valid.problems.size() == 1);
  CHECK(d.valid.problems[0].kind == "class with no training boxes");
  CHECK_FALSE(d.valid.problems[0].item);
  CHECK(d.valid.problems[0].message ==
        (dir / "validation/annotations/v1.xml") +
            ":6: class 'Cat' appears only in the validation split (2 boxes in 2 files, the first here): training "
            "has no boxes for it, so the net cannot learn it and its AP will be 0");

  // With a names file that lacks it: an unknown class, as anywhere else (and only that).
  write_text_file(dir / "names.txt", "cat\n");
  OpenOptions options;
  options.names_file = dir / "names.txt";
  d = read_voc(dir.path(), options);
  REQUIRE(d.valid.problems.size() == 2);
  for (const Problem& p : d.valid.problems) CHECK(p.kind == "unknown class");
  CHECK(d.valid.problems[0].message.rfind((dir / "validation/annotations/v1.xml") + ":6: class 'Cat' is not in", 0) ==
        0);
}

TEST_CASE("voc: image paths from <filename>, or the XML's own name with an image extension") {
  TempDir dir;
  make_split(dir, "train");
  write_text_file(dir / "train/images/noext.png", "");
  write_text_file(dir / "train/images/b.bmp", "");
  write_text_file(dir / "train/images/c.jpeg", "");
  write_text_file(dir / "train/annotations/a.xml", voc_file("noext", 4, 4, object("x", "1", "1", "2", "2")));
  write_text_file(dir / "train/annotations/b.xml", voc_file("renamed.jpg", 4, 4, ""));
  write_text_file(dir / "train/annotations/c.xml",
                  "<annotation><size><width>4</width><height>4</height></size></annotation>");
  write_text_file(dir / "train/annotations/d.xml", voc_file("gone.jpg", 4, 4, ""));
  write_text_file(dir / "train/annotations/e.xml", "<annotation/>");
  Dataset d = read_voc(dir.path(), {});
  REQUIRE(d.train.samples.size() == 5);
  CHECK(d.train.samples[0].image == dir / "train/images/noext.png");
  CHECK(d.train.samples[1].image == dir / "train/images/b.bmp");
  CHECK(d.train.samples[2].image == dir / "train/images/c.jpeg");
  CHECK(d.train.samples[3].image == dir / "train/images/gone.jpg");  // missing: reported by the loader
  CHECK(d.train.samples[4].image == dir / "train/images/e.jpg");
  CHECK(d.train.samples[4].boxes.empty());
  CHECK(d.valid.samples.empty());
  CHECK(d.class_names == std::vector<std::string>{"x"});
}

TEST_CASE("voc: an image without annotation file is not part of the set, and is reported") {
  TempDir dir;
  make_split(dir, "train");
  for (const char* image : {"a.jpg", "b.png", "c.JPG", "d.jpg", "notes.txt"})
    write_text_file(dir / ("train/images/" + std::string(image)), "");
  write_text_file(dir / "train/annotations/a.xml", voc_file("a.jpg", 4, 4, object("x", "1", "1", "2", "2")));
  write_text_file(dir / "train/annotations/other.xml", voc_file("d.jpg", 4, 4, ""));  // names d.jpg
  Dataset d = read_voc(dir.path(), {});
  REQUIRE(d.train.samples.size() == 2);
  CHECK(d.train.samples[0].image == dir / "train/images/a.jpg");
  CHECK(d.train.samples[1].image == dir / "train/images/d.jpg");
  REQUIRE(d.train.problems.size() == 2);  // b.png and c.JPG, sorted; not notes.txt
  for (const Problem& p : d.train.problems) {
    CHECK(p.kind == "image without annotation");
    CHECK_FALSE(p.item);  // nothing left out: it was never in
  }
  CHECK(d.train.problems[0].message ==
        (dir / "train/images/b.png") + ": no annotation file (" + (dir / "train/annotations/b.xml") +
            ", or one whose <filename> names it): not part of the set, as in imageai");
  CHECK(d.train.problems[1].message.rfind(dir / "train/images/c.JPG", 0) == 0);
  CHECK(d.train.left_out() == 0);
}

TEST_CASE("voc: without <size> the image header gives the size") {
  TempDir dir;
  make_split(dir, "train");
  Image image;
  image.width = 13;
  image.height = 7;
  image.rgb.assign(13 * 7 * 3, 128);
  write_image(dir / "train/images/a.png", image);
  write_text_file(dir / "train/annotations/a.xml", voc_file("a.png", 0, 0, object("x", "1", "1", "13", "7")));
  // <size> with zeros, as some tools write it, counts as absent.
  write_text_file(dir / "train/annotations/b.xml",
                  "<annotation><filename>a.png</filename><size><width>0</width><height>0</height></size>\n" +
                      object("x", "2", "1", "4", "7") + "</annotation>");
  // No size and no image: the sample stays (left out later as a missing image), without boxes.
  write_text_file(dir / "train/annotations/c.xml", voc_file("none.png", 0, 0, object("x", "1", "1", "2", "2")));
  Dataset d = read_voc(dir.path(), {});
  REQUIRE(d.train.samples.size() == 3);
  REQUIRE(d.train.samples[0].boxes.size() == 1);
  check_box(d.train.samples[0].boxes[0], 0.5, 0.5, 1, 1, 0, false);
  REQUIRE(d.train.samples[1].boxes.size() == 1);
  check_box(d.train.samples[1].boxes[0], 2.5 / 13, 0.5, 3.0 / 13, 1, 0, false);
  CHECK(d.train.samples[2].boxes.empty());

  write_text_file(dir / "train/images/bad.jpg", "not a jpeg at all");
  write_text_file(dir / "train/annotations/d.xml", voc_file("bad.jpg", 0, 0, ""));
  check_voc_error(dir, {}, dir / "train/annotations/d.xml:1", "no usable <size> and the image size cannot be read");
}

TEST_CASE("voc: boxes touching the border from 0-based tools are clipped and counted") {
  TempDir dir;
  make_split(dir, "train");
  write_text_file(dir / "train/annotations/a.xml", voc_file("a.jpg", 200, 100, object("x", "0", "1", "200", "100")));
  Dataset d = read_voc(dir.path(), {});
  REQUIRE(d.train.samples.at(0).boxes.size() == 1);
  check_box(d.train.samples[0].boxes[0], 0.5, 0.5, 1, 1, 0, false);
  CHECK(d.train.counts.clipped_boxes == 1);
}

TEST_CASE("voc: malformed annotations are errors naming the XML file and line") {
  TempDir dir;
  make_split(dir, "train");
  std::string file = dir / "train/annotations/a.xml";
  auto expect = [&](const std::string& xml, int line, const std::string& fragment) {
    CAPTURE(xml);
    write_text_file(file, xml);
    check_voc_error(dir, {}, file + ":" + std::to_string(line), fragment);
  };
  expect("<annotation>\n<object>\n</annotation>", 3, "</annotation> does not match <object> opened at line 2");
  expect("<annotation>\n<filename>a.jpg", 2, "the file ends before </filename>");
  expect("<voc/>", 1, "the root element is <voc>, expected <annotation>");
  expect(voc_file("a.jpg", 10, 10, object("x", "5", "1", "4", "2")), 5, "xmax < xmin");
  expect(voc_file("a.jpg", 10, 10, object("x", "1", "3", "4", "2")), 5, "ymax < ymin");
  expect(voc_file("a.jpg", 10, 10, object("x", "abc", "1", "4", "2")), 5, "<xmin> is 'abc', expected a number");
  expect(voc_file("a.jpg", 10, 10, object("x", "1", "1", "4", "nan")), 5, "<ymax> is 'nan', expected a number");
  expect(voc_file("a.jpg", 10, 10, object("x", "1", "1", "4px", "2")), 5, "<xmax> is '4px'");
  expect(voc_file("a.jpg", 10, 10, "  <object>\n<name>x</name>\n<bndbox><xmin>1</xmin><ymin>1</ymin>\n"
                                   "<xmax>3</xmax></bndbox></object>\n"),
         7, "<bndbox> has no <ymax> element");
  expect(voc_file("a.jpg", 10, 10, "<object>\n<name>x</name></object>\n"), 5, "<object> has no <bndbox>");
  expect(voc_file("a.jpg", 10, 10, "<object>\n<bndbox/></object>\n"), 5, "<object> has no <name>");
  expect(voc_file("a.jpg", 10, 10, object("", "1", "1", "2", "2")), 5, "<name> is empty");
  expect(voc_file("a.jpg", 10, 10, object("x", "1", "1", "2", "2", "<difficult>2</difficult>")), 5,
         "<difficult> is '2', expected 0 or 1");
  expect("<annotation>\n<size><width>-5</width><height>4</height></size>\n</annotation>", 2, "negative image size");
  expect("<annotation>\n<size><width>wide</width></size>\n</annotation>", 2, "<width> is 'wide'");
  // Pixels beyond <size>, with the object's line: the edges crossed and the size (VOC boxes are
  // pixels; not darknet's normalisation message). A box mostly inside is not "outside".
  expect(voc_file("a.jpg", 10, 10, "\n" + object("x", "1", "1", "30", "2")), 6,
         "the box (1, 1) - (30, 2) extends past the image's right edge (xmax 30 > width 10); the image is 10x10 "
         "pixels by its <size> (line 4)");
  expect(voc_file("a.jpg", 10, 10, object("x", "-5", "2", "4", "20")), 5,
         "extends past the image's left edge (xmin -5 < 1) and its bottom edge (ymax 20 > height 10)");
  expect(voc_file("a.jpg", 10, 10, object("x", "3", "-8", "4", "-2")), 5,
         "lies entirely outside the image, past its top edge (ymin -8 < 1)");
}

TEST_CASE("voc: layout errors say what was expected") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(read_voc(dir.path(), {}),
                       doctest::Contains(((dir / "train") + " is missing; expected imageai's layout").c_str()), Error);
  std::filesystem::create_directories(dir / "train/images");
  CHECK_THROWS_WITH_AS(read_voc(dir.path(), {}), doctest::Contains(((dir / "train/annotations") + " is missing").c_str()),
                       Error);
  std::filesystem::create_directories(dir / "train/annotations");
  CHECK_THROWS_WITH_AS(read_voc(dir.path(), {}), doctest::Contains("no .xml annotation files in"), Error);
  write_text_file(dir / "train/annotations/a.xml", voc_file("a.jpg", 4, 4, ""));
  CHECK_THROWS_WITH_AS(read_voc(dir.path(), {}), doctest::Contains("no <object> in any annotation"), Error);
  std::filesystem::create_directories(dir / "validation/annotations");
  CHECK_THROWS_WITH_AS(read_voc(dir.path(), {}), doctest::Contains(((dir / "validation/images") + " is missing").c_str()),
                       Error);
}
