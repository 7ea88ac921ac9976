# libFuzzer targets: one executable per fuzz/*.c, built with
#   cmake -S . -B build-fuzz -DE8KV_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo
# The library and engine sources are compiled into each target (not linked from e8kv_static) so that
# libFuzzer's coverage and the sanitizers reach them. Targets may include public headers, engine/ and src/.
# Corpora live in fuzz/corpus/<name>/ and replay in the ordinary tests.
option(E8KV_FUZZ "Build the libFuzzer targets in fuzz/ (clang only)" OFF)
if(E8KV_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "E8KV_FUZZ=ON needs clang (-DCMAKE_C_COMPILER=clang)")
  endif()
  file(GLOB E8KV_FUZZ_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/fuzz/*.c)
  foreach(src IN LISTS E8KV_FUZZ_SOURCES)
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src} ${E8KV_LIB_SOURCES} ${E8KV_ENGINE_SOURCES})
    target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/engine
                               ${CMAKE_SOURCE_DIR}/src)
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
                           -fno-omit-frame-pointer)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(${name} PRIVATE PkgConfig::ZSTD PkgConfig::XXHASH PkgConfig::OPENBLAS Threads::Threads m)
  endforeach()
endif()
