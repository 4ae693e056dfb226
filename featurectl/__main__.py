from featurectl.cli import main

main()
