from oomdoctor.profiles.report import main

raise SystemExit(main())
