// Image decode and encode through stb_image / stb_image_write, with the checks stb leaves to
// us: format by signature, dimension limits, truncated BMP data, and errors naming the file.
#include "data/image.h"

#include <stb_image.h>
#include <stb_image_write.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "runtime/check.h"

namespace yolo::data {
namespace {

// Larger than any real training image, small enough that width*height*3 fits comfortably in
// an int (stb's arithmetic) and that a forged header cannot make us allocate gigabytes.
constexpr int kMaxSide = 32768;
constexpr int64_t kMaxPixels = int64_t(1) << 28;

enum class Kind { Jpeg, Png, Bmp, Unknown };

// stb would also try TGA, whose header has no signature, so garbage could "decode"; we accept
// only the formats we promise, recognised by their leading bytes.
Kind kind_of(const uint8_t* bytes, size_t size) {
  static const uint8_t png[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (size >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return Kind::Jpeg;
  if (size >= 8 && std::memcmp(bytes, png, 8) == 0) return Kind::Png;
  if (size >= 2 && bytes[0] == 'B' && bytes[1] == 'M') return Kind::Bmp;
  return Kind::Unknown;
}

// The message for bytes that are no JPEG, PNG or BMP: a format named where its signature is known
// (an image we do not read is not a corrupt one).
std::string not_read_message(const uint8_t* bytes, size_t size) {
  const std::string format = unsupported_image_format(bytes, size);
  if (format.empty()) return "not a JPEG, PNG or BMP image (unrecognised leading bytes)";
  return "a " + format + " image: this program reads JPEG, PNG and BMP only; convert it first (for example "
         "ImageMagick's `convert IMAGE IMAGE.png`, then point the labels at the new name)";
}

// stb's BMP decoder reads past the end as zeros (its JPEG and PNG decoders do notice a cut-off
// file; the tests check both). The header's file-size field, when the writer filled it in,
// says how many bytes there should be.
bool bmp_is_complete(const uint8_t* bytes, size_t size) {
  if (size < 6) return false;
  uint32_t declared = uint32_t(bytes[2]) | uint32_t(bytes[3]) << 8 | uint32_t(bytes[4]) << 16 | uint32_t(bytes[5]) << 24;
  return declared == 0 || declared <= size;
}

// stb_image grows its buffer for a PNG's compressed data to what each chunk's length field
// claims before reading the chunk, so a 100-byte file claiming a 2 GiB chunk made it allocate
// 2 GiB. Every chunk (length, type, data, CRC) must lie within the file; the walk stops at IEND.
// Returns "" or why not.
// Likewise it allocates the whole image before inflating, so a 70-byte file whose header claims
// 16384 x 16384 pixels cost 805 MB: the compressed data (IDAT) must be able to hold the pixels
// the header claims, at deflate's best ratio (about 1032:1).
std::string png_chunk_problem(const uint8_t* bytes, size_t size) {
  auto be32 = [&](size_t at) {
    return uint32_t(bytes[at]) << 24 | uint32_t(bytes[at + 1]) << 16 | uint32_t(bytes[at + 2]) << 8 |
           uint32_t(bytes[at + 3]);
  };
  size_t at = 8;  // after the signature
  uint64_t compressed = 0, raw = 0;
  while (size - at >= 8) {
    const uint32_t length = be32(at);
    const size_t left = size - at - 8;
    if (length > left || left - length < 4)
      return "a PNG chunk at byte " + std::to_string(at) + " claims " + std::to_string(length) + " bytes, only " +
             std::to_string(left) + " remain: truncated?";
    if (std::memcmp(bytes + at + 4, "IEND", 4) == 0) break;
    if (std::memcmp(bytes + at + 4, "IHDR", 4) == 0 && length >= 13) {
      const uint64_t width = be32(at + 8), height = be32(at + 12), depth = bytes[at + 16];
      const int type = bytes[at + 17];
      const uint64_t channels = type == 2 ? 3 : type == 4 ? 2 : type == 6 ? 4 : 1;
      raw = height * (1 + (width * channels * depth + 7) / 8);  // a filter byte per row
    }
    if (std::memcmp(bytes + at + 4, "IDAT", 4) == 0) compressed += length;
    at += size_t(length) + 12;
  }
  if (raw > 1032 * compressed + 4096)
    return "its header claims " + std::to_string(raw) + " bytes of pixels, which its " + std::to_string(compressed) +
           " bytes of compressed data cannot hold: truncated or forged?";
  return "";
}

// stb_image 2.27 (Debian's) decodes a JPEG scan with whatever Huffman table its header names,
// defined or not; an undefined one is uninitialised memory, which crashed the decoder on mutated
// files (fixed upstream in 2.28). Each scan's tables must have been defined (DHT) before it, with
// at most 256 symbols each. Other malformations are left to stb, which reports them. Returns ""
// or why not.
std::string jpeg_table_problem(const uint8_t* bytes, size_t size) {
  bool defined[2][4] = {};  // [DC, AC][table id]
  auto undefined = [](const char* table_class, int id) {
    return "a JPEG scan uses Huffman table " + std::string(table_class) + " " + std::to_string(id) +
           ", which the file does not define";
  };
  bool progressive = false;
  size_t at = 2;  // after SOI
  while (size - at >= 4) {
    const uint8_t marker = bytes[at + 1];
    if (bytes[at] != 0xFF || marker == 0xFF) {  // padding between segments (stb skips it too), fill bytes
      ++at;
      continue;
    }
    if (marker == 0xD9) break;                                   // end of image
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // no length field
      at += 2;
      continue;
    }
    const size_t length = size_t(bytes[at + 2]) << 8 | bytes[at + 3];
    if (length < 2 || length > size - at - 2) break;
    const uint8_t* p = bytes + at + 4;
    const size_t n = length - 2;
    at += 2 + length;
    if (marker == 0xC2) progressive = true;
    if (marker == 0xC4) {  // one or more tables: class/id, 16 counts, the symbols
      for (size_t t = 0; n - t >= 17;) {
        const int table_class = p[t] >> 4, id = p[t] & 15;
        size_t symbols = 0;
        for (int k = 1; k <= 16; ++k) symbols += p[t + k];
        if (table_class > 1 || id > 3 || symbols > n - t - 17) break;
        // stb 2.27 would write the code lengths of more past its 257-entry array.
        if (symbols > 256) return "a JPEG Huffman table has " + std::to_string(symbols) + " symbols (at most 256)";
        defined[table_class][id] = true;
        t += 17 + symbols;
      }
    } else if (marker == 0xDA) {  // start of scan: components, then Ss, Se, Ah/Al
      const size_t components = n >= 1 ? p[0] : 0;
      if (n < 1 + 2 * components + 3) break;
      // Progressive: the first DC pass decodes with DC tables (refinements read bare bits), AC
      // passes with AC tables.
      const uint8_t band_start = p[1 + 2 * components], high_bit = p[3 + 2 * components] >> 4;
      const bool dc = !progressive || (band_start == 0 && high_bit == 0), ac = !progressive || band_start != 0;
      for (size_t c = 0; c < components; ++c) {
        const int dc_id = p[2 + 2 * c] >> 4, ac_id = p[2 + 2 * c] & 15;
        if (dc_id > 3 || ac_id > 3) break;
        if (dc && !defined[0][dc_id]) return undefined("DC", dc_id);
        if (ac && !defined[1][ac_id]) return undefined("AC", ac_id);
      }
      // The entropy-coded data: up to a marker other than a stuffed FF (FF 00) or a restart.
      while (size - at >= 2 && !(bytes[at] == 0xFF && bytes[at + 1] != 0 && (bytes[at + 1] & 0xF8) != 0xD0)) ++at;
    }
  }
  return "";
}

std::string stb_reason() {
  const char* reason = stbi_failure_reason();  // thread-local: stb_impl.cpp is compiled as C++20
  return reason ? reason : "unknown reason";
}

bool check_dimensions(int width, int height, const std::string& name, std::string& error) {
  if (width <= 0 || height <= 0 || width > kMaxSide || height > kMaxSide ||
      int64_t(width) * height > kMaxPixels) {
    error = name + ": image size " + std::to_string(width) + "x" + std::to_string(height) +
            " is outside what we accept (sides 1.." + std::to_string(kMaxSide) + ", at most 2^28 pixels); corrupt header?";
    return false;
  }
  return true;
}

// Why `path` cannot be opened, in the user's terms.
std::string open_failure(const std::string& path, int saved_errno) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) return path + ": no such file";
  return path + ": cannot open (" + std::strerror(saved_errno) + ")";
}

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Opens `path` for reading, or sets `error` (a directory would open and then fail to read).
File open_for_read(const std::string& path, std::string& error) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    error = path + ": is a directory, not an image file";
    return nullptr;
  }
  errno = 0;
  File file(std::fopen(path.c_str(), "rb"));
  if (!file) error = open_failure(path, errno);
  return file;
}

bool read_file(const std::string& path, std::vector<uint8_t>& bytes, std::string& error) {
  File file = open_for_read(path, error);
  if (!file) return false;
  bytes.clear();
  uint8_t chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, file.get())) > 0) bytes.insert(bytes.end(), chunk, chunk + got);
  if (std::ferror(file.get())) {
    error = path + ": read error (" + std::strerror(errno) + ")";
    return false;
  }
  return true;
}

std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return ext;
}

void append_bytes(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<uint8_t>*>(context);
  auto* p = static_cast<const uint8_t*>(data);
  out->insert(out->end(), p, p + size);
}

}  // namespace

std::string unsupported_image_format(const uint8_t* bytes, size_t size) {
  auto at = [&](size_t offset, const char* text) {
    const size_t n = std::strlen(text);
    return size >= offset + n && std::memcmp(bytes + offset, text, n) == 0;
  };
  if (at(0, "RIFF") && at(8, "WEBP")) return "WebP";
  if (at(0, "GIF87a") || at(0, "GIF89a")) return "GIF";
  if (size >= 4 && ((bytes[0] == 'I' && bytes[1] == 'I' && bytes[2] == 42 && bytes[3] == 0) ||
                    (bytes[0] == 'M' && bytes[1] == 'M' && bytes[2] == 0 && bytes[3] == 42)))
    return "TIFF";
  if (at(4, "ftyp")) {
    for (const char* brand : {"heic", "heix", "hevc", "mif1", "msf1"})
      if (at(8, brand)) return "HEIC";
    if (at(8, "avif") || at(8, "avis")) return "AVIF";
  }
  if (size >= 2 && bytes[0] == 0xFF && bytes[1] == 0x0A) return "JPEG XL";
  if (at(4, "jP  ")) return "JPEG 2000";
  return "";
}

bool decode_image(const uint8_t* bytes, size_t size, const std::string& name, Image& image, std::string& error) {
  if (size == 0) {
    error = name + ": empty file, not an image";
    return false;
  }
  if (size > size_t(INT_MAX)) {
    error = name + ": file larger than 2 GiB, not accepted as an image";
    return false;
  }
  Kind kind = kind_of(bytes, size);
  if (kind == Kind::Unknown) {
    error = name + ": " + not_read_message(bytes, size);
    return false;
  }
  int width = 0, height = 0, channels = 0;
  if (!stbi_info_from_memory(bytes, int(size), &width, &height, &channels)) {
    error = name + ": corrupt image header (" + stb_reason() + ")";
    return false;
  }
  if (!check_dimensions(width, height, name, error)) return false;
  // A JPEG codes every 8x8 block of every component with at least a bit (its DC term), so a
  // header claiming more blocks than 4 x 8 bits per byte of the file is forged or cut short; stb
  // would allocate the whole image before finding out.
  if (kind == Kind::Jpeg && uint64_t(width) * uint64_t(height) / 2048 > size) {
    error = name + ": corrupt image data (its header claims " + std::to_string(width) + "x" + std::to_string(height) +
            " pixels, more than its " + std::to_string(size) + " bytes can code: truncated or forged?)";
    return false;
  }
  if (kind == Kind::Bmp && !bmp_is_complete(bytes, size)) {
    error = name + ": truncated or corrupt image data (ends before the image does)";
    return false;
  }
  if (kind == Kind::Png || kind == Kind::Jpeg) {
    if (std::string why = kind == Kind::Png ? png_chunk_problem(bytes, size) : jpeg_table_problem(bytes, size);
        !why.empty()) {
      error = name + ": corrupt image data (" + why + ")";
      return false;
    }
  }
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(bytes, int(size), &width, &height, &channels, 3), stbi_image_free);
  if (!pixels) {
    error = name + ": corrupt image data (" + stb_reason() + ")";
    return false;
  }
  image.width = width;
  image.height = height;
  image.rgb.assign(pixels.get(), pixels.get() + size_t(width) * height * 3);
  return true;
}

bool read_image(const std::string& path, Image& image, std::string& error) {
  std::vector<uint8_t> bytes;
  if (!read_file(path, bytes, error)) return false;
  return decode_image(bytes.data(), bytes.size(), path, image, error);
}

bool read_image_size(const std::string& path, int& width, int& height, std::string& error) {
  File file = open_for_read(path, error);
  if (!file) return false;
  uint8_t head[16] = {};
  size_t got = std::fread(head, 1, sizeof head, file.get());
  if (got == 0) {
    error = path + ": empty file, not an image";
    return false;
  }
  if (kind_of(head, got) == Kind::Unknown) {
    error = path + ": " + not_read_message(head, got);
    return false;
  }
  std::rewind(file.get());
  int channels = 0;
  if (!stbi_info_from_file(file.get(), &width, &height, &channels)) {
    error = path + ": corrupt image header (" + stb_reason() + ")";
    return false;
  }
  return check_dimensions(width, height, path, error);
}

void write_image(const std::string& path, const Image& image, int jpeg_quality) {
  std::string ext = lower_extension(path);
  bool png = ext == ".png";
  if (!png && ext != ".jpg" && ext != ".jpeg")
    throw Error("cannot write image " + path + ": unknown extension '" + ext + "' (use .png, .jpg or .jpeg)");
  std::string why;
  if (!check_dimensions(image.width, image.height, path, why)) throw Error("cannot write image " + why);
  if (image.rgb.size() != size_t(image.width) * image.height * 3)
    throw Error("cannot write image " + path + ": pixel buffer holds " + std::to_string(image.rgb.size()) +
                " bytes, expected width*height*3 = " + std::to_string(size_t(image.width) * image.height * 3));
  if (!png && (jpeg_quality < 1 || jpeg_quality > 100))
    throw Error("cannot write image " + path + ": JPEG quality " + std::to_string(jpeg_quality) + " is outside 1..100");

  // Encode in memory, then write with checked stdio: stb's own file writers ignore fwrite errors.
  std::vector<uint8_t> encoded;
  int ok = png ? stbi_write_png_to_func(append_bytes, &encoded, image.width, image.height, 3, image.rgb.data(), image.width * 3)
               : stbi_write_jpg_to_func(append_bytes, &encoded, image.width, image.height, 3, image.rgb.data(), jpeg_quality);
  if (!ok) throw Error("cannot write image " + path + ": encoding failed");
  errno = 0;
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) throw Error("cannot write image " + path + ": " + std::strerror(errno));
  bool written = std::fwrite(encoded.data(), 1, encoded.size(), file) == encoded.size();
  int saved_errno = errno;
  if (std::fclose(file) != 0 && written) {
    written = false;
    saved_errno = errno;
  }
  if (!written) {
    std::remove(path.c_str());  // no half-written image left behind to fail later as "corrupt"
    throw Error("cannot write image " + path + ": " + std::strerror(saved_errno));
  }
}

}  // namespace yolo::data
