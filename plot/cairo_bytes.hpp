// Cairo's output streamed into bytes: what render() and the heatmaps' embedded images share.
// Internal to plot/.
#pragma once

#include <cairo.h>

#include <string>

namespace qkv::plot::detail {

/// A cairo_write_func_t appending to the std::string `closure` points at.
cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length);

/// The surface as a PNG file's bytes; throws std::runtime_error if Cairo cannot encode it.
std::string png_bytes(cairo_surface_t* surface);

}  // namespace qkv::plot::detail
