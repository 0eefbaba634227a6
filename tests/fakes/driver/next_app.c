/* Calls foo, linked against next_c's; prints what the chain of foos returned. */
#include <stdio.h>

const char *foo(void);

int main(void)
{
    printf("%s\n", foo());
    return 0;
}
