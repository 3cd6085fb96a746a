// stitch/export.hpp — marks the symbols libstitch.so exports (everything else is hidden).
#pragma once

#if defined(_WIN32)
#define STITCH_EXPORT __declspec(dllexport)
#else
#define STITCH_EXPORT __attribute__((visibility("default")))
#endif
