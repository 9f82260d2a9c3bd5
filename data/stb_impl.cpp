// The one translation unit that compiles stb_image and stb_image_write (system package
// libstb-dev, header-only) into the program; everything else includes data/image.h.
#define STBI_FAILURE_USERMSG
#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
