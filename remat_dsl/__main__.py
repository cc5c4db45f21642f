from remat_dsl.cli import program

program()
