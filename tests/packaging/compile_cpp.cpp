/* Compile test: compile_c.c (every header with its implementation) as C++ (c++11 and c++17),
   -Wall -Wextra -Werror -Wpedantic. */
#include "compile_c.c"
