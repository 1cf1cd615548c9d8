/* The ds4f subcommands. Each lives in its own src/app/cmd_NAME.c, takes the arguments after its
 * name (argv[0] is the subcommand name) and returns the process exit status. */
#ifndef DS4F_APP_COMMANDS_H
#define DS4F_APP_COMMANDS_H

int cmd_inspect(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_check(int argc, char **argv);

#endif
